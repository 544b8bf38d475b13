"""Outside strings never drive the terminal: escapes, C1 controls and bidi overrides are shown, not obeyed."""

from __future__ import annotations

import io
import json
import unicodedata

import sysroot
from conftest import clean_env, run_tool
from hypothesis import given
from hypothesis import strategies as st
from libtpu_server import FakeMetricsService, v5e_host
from rich.console import Console

from tpu_tools.render.table import Column, TableData, plain_table, rich_table
from tpu_tools.sanitize import is_safe, safe_text

HOSTILE_ARGV0 = "\x1b]0;PWNED\x07\x1b[2Jpython3"
HOSTILE = [HOSTILE_ARGV0, "\u202egnp.exe", "csi\u009b31m", "zero\u200bwidth"]
# Bytes a terminal would act on: ESC, BEL, 8-bit CSI (UTF-8 C2 9B), RLO (E2 80 AE), zero width space (E2 80 8B).
FORBIDDEN_BYTES = (b"\x1b", b"\x07", b"\xc2\x9b", b"\xe2\x80\xae", b"\xe2\x80\x8b")


def _assert_inert(raw: bytes) -> None:
    for sequence in FORBIDDEN_BYTES:
        assert sequence not in raw, (sequence, raw[:2000])


def _unsafe_code_points() -> list[int]:
    return [c for c in range(0x110000) if unicodedata.category(chr(c)) in ("Cc", "Cf", "Zl", "Zp", "Cs")]


def test_every_control_format_and_separator_character_is_escaped():
    missed = [hex(c) for c in _unsafe_code_points() if chr(c) not in "\n\t" and is_safe(chr(c), multiline=True)]
    assert missed == []
    assert all(not is_safe(chr(c)) for c in _unsafe_code_points())


def test_escapes_are_visible_and_plain_text_is_unchanged():
    assert safe_text(HOSTILE_ARGV0) == "\\x1b]0;PWNED\\x07\\x1b[2Jpython3"
    assert safe_text("a\u202eb\u2066c") == "a\\u202eb\\u2066c"
    assert safe_text("line one\n\tline two", multiline=True) == "line one\n\tline two"
    assert safe_text("line one\nline two") == "line one\\x0aline two"
    text = "python3 train.py --lr 3e-4 é 中文 🙂"
    assert safe_text(text) == text


@given(st.text())
def test_sanitised_text_is_always_safe(text):
    assert is_safe(safe_text(text))
    assert is_safe(safe_text(text, multiline=True), multiline=True)


def test_tables_escape_cells_headers_and_titles():
    table = TableData([Column("NAME\x1b[31m"), Column("VALUE")], title="t\u202eitle")
    table.add_row(HOSTILE_ARGV0, "\u009b2J")
    table.add_row("[link=http://x.test]click[/link]", "[red]x[/red]")
    _assert_inert(plain_table(table).encode())
    buffer = io.StringIO()
    Console(file=buffer, width=100, force_terminal=True, color_system="truecolor").print(rich_table(table, 100))
    shown = buffer.getvalue()
    assert "\x1b]" not in shown
    assert "\x9b" not in shown  # no OSC (title, hyperlink) and no 8-bit CSI
    assert "[link=http://x.test]click[/link]" in shown
    assert "[red]x[/red]" in shown  # markup shown, not obeyed


def _hostile_host(root):
    host = sysroot.v5e_host(root, holders={3001: [0]})
    host.process(sysroot.FakeProcess(3002, 1001, HOSTILE, ["/dev/vfio/17"]))
    return clean_env(TPU_TOOLS_SYSROOT=str(root))


def test_tpu_ls_shows_a_hostile_holder_command_line_inert(tmp_path):
    env = _hostile_host(tmp_path)
    for args in (("--no-runtime",), ("--no-runtime", "--format", "table")):
        result = run_tool("tpu-ls", *args, env=env)
        assert result.returncode == 0, result.stderr
        raw = result.stdout.encode()
        _assert_inert(raw)
        assert "PWNED" in result.stdout
        assert ("\\x1b]0;PWNED\\x07\\x1b[2Jpython3" in result.stdout or "table" in args)
    document = json.loads(run_tool("tpu-ls", "--no-runtime", "--json", env=env).stdout)
    holders = [h for chip in document["chips"] for h in chip["holders"] if h["pid"] == 3002]
    assert holders[0]["command"].startswith(HOSTILE_ARGV0)  # JSON keeps the data exactly (escaped by JSON)


def test_tpu_ls_shows_hostile_libtpu_host_name_and_core_error_inert(tmp_path):
    env = _hostile_host(tmp_path)
    fixture = v5e_host()
    fixture.status.host_name = "\x1b]0;PWNED\x07host\u202e"
    fixture.status.core_states[5].error_message = "halted\x1b[2J\u009b31m\u2067"
    with FakeMetricsService(fixture) as service:
        result = run_tool("tpu-ls", "--no-runtime", "--runtime-status", "--metrics-addr", service.address, env=env)
    assert result.returncode == 0, result.stderr
    _assert_inert(result.stdout.encode() + result.stderr.encode())
    assert "\\x1b]0;PWNED\\x07host\\u202e" in result.stdout
    assert "halted\\x1b[2J\\x9b31m\\u2067" in result.stdout


def test_profile_summary_shows_hostile_op_and_function_names_inert(tmp_path):
    from xspace import Event, Plane, write_xspace

    us = 1000
    module = "jit_\x1b]0;PWNED\x07step(1)"
    device = Plane("/device:TPU:0", lines={
        "XLA Modules": [Event(module, 0, 400 * us)],
        "XLA Ops": [Event("fusion\x1b[2J\u202e.1", 0, 100 * us), Event("conv\u009b31m.2", 100 * us, 250 * us)],
    })
    host = Plane("/host:CPU", lines={"python": [
        Event("PjitFunction(\x1b]0;PWNED\x07step)", 0, 60 * us),
        Event("PjRtCApiLoadedExecutable::Execute", 10 * us, 40 * us),
    ]})
    write_xspace(tmp_path, "tpu-vm", [device, host], duration_ns=1_000 * us)
    for args in ((), ("--format", "table")):
        result = run_tool("tpu-profile", "summary", str(tmp_path), *args)
        assert result.returncode == 0, result.stderr
        _assert_inert(result.stdout.encode() + result.stderr.encode())
        assert "PWNED" in result.stdout or "fusion" in result.stdout
