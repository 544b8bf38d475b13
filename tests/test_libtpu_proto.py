"""The project's .proto: its generated modules are fresh (test_libtpu_wire_contract.py checks the contract)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from conftest import REPO


def _gen_proto():
    spec = importlib.util.spec_from_file_location("gen_proto", REPO / "tools" / "gen_proto.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_proto"] = module
    spec.loader.exec_module(module)
    return module


def test_checked_in_generated_modules_match_the_proto():
    try:
        stale = _gen_proto().stale_files()
    except SystemExit as error:  # the pinned grpcio-tools is not the installed one
        pytest.fail(str(error))
    assert not stale, f"regenerate with `python tools/gen_proto.py`: {[str(p) for p in stale]}"
