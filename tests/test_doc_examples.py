"""The deterministic examples in the docs, run again: their figures must be what the programs say today."""

from __future__ import annotations

import re
import shlex

from conftest import REPO, clean_env, run_tool


def example(doc: str, command: str) -> tuple[list[str], str | None]:
    """(output lines, the ```python block just before it) of the example `$ command` in docs/<doc>."""
    text = (REPO / doc).read_text()
    blocks = re.findall(r"```(\w*)\n(.*?)```", text, re.S)
    for index, (_, body) in enumerate(blocks):
        lines = body.rstrip("\n").split("\n")
        if lines[0] == f"$ {command}":
            python = next((b for lang, b in reversed(blocks[:index]) if lang == "python"), None)
            return lines[1:], python
    raise AssertionError(f"{doc} has no example `$ {command}`")


HLO = ("tpu-profile hlo model:mlp --arg bf16[256,1024] --arg bf16[1024,4096] --arg bf16[4096,1024] "
       "--chip v5e --out hlo-mlp")


def test_the_hlo_example_in_the_profile_docs(tmp_path):
    shown, model = example("docs/profile.md", HLO)
    assert model is not None
    (tmp_path / "model.py").write_text(model)
    program, *args = shlex.split(HLO)
    result = run_tool(program, *args, cwd=tmp_path, env=clean_env(JAX_PLATFORMS="cpu"))
    assert result.returncode == 0, result.stderr
    timing = re.compile(r"^  lowering .*, XLA compile ")  # the only figures that vary from run to run
    assert [line for line in result.stdout.rstrip("\n").split("\n") if not timing.match(line)] == \
        [line for line in shown if not timing.match(line)]


# The collectors whose outcome is the host's: what it has installed, loaded or left behind. The example's host
# had no accelerator, no driver tools and no libtpu; a GPU machine has nvidia-smi and its PCI functions, and
# libtpu leaves /tmp/tpu_logs on any host that loaded it.
HOST_DEPENDENT_COLLECTORS = {"system.pci", "system.modules", "accelerators.nvml", "accelerators.nvidia_smi",
                             "accelerators.amdsmi", "accelerators.amd_smi", "accelerators.libtpu", "logs.libtpu",
                             "logs.libtpu_diagnostics", "logs.kernel"}
DUMP_SHOW = "tpu-dump show tpu-dump-vm-20261122T194824Z.tar.gz"


def _not_ok(listing: list[str]) -> dict[str, str]:
    """The collectors `tpu-dump show` lists (those that are not ok) with their status."""
    rows = (re.match(r"([a-z_]+\.[a-z_]+)\s+(skipped|failed|timed out)\s", line) for line in listing)
    return {row[1]: row[2] for row in rows if row}


def test_the_collector_counts_in_the_dump_docs(tmp_path):
    shown, _ = example("docs/dump.md", "tpu-dump --host-devices 4")
    shown_listing, _ = example("docs/dump.md", DUMP_SHOW)
    env = clean_env(TPU_TOOLS_RUNTIME_DIR=str(tmp_path / "run"), JAX_COMPILATION_CACHE_DIR=None)
    result = run_tool("tpu-dump", "--host-devices", "4", "-o", str(tmp_path / "b.tar.gz"), env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    shown_line = next(line for line in shown if line.startswith("collectors: "))
    ok, skipped = (int(n) for n in re.fullmatch(r"collectors: (\d+) ok, (\d+) skipped", shown_line).groups())
    documented = _not_ok(shown_listing)
    assert set(documented.values()) == {"skipped"} and len(documented) == skipped  # the two examples agree
    listing = run_tool("tpu-dump", "show", str(tmp_path / "b.tar.gz"), env=env).stdout
    here = _not_ok(listing.splitlines())
    # every collector does here what the example says, but for those whose outcome is the host's
    assert set(here.values()) <= {"skipped"}, here
    assert documented.keys() ^ here.keys() <= HOST_DEPENDENT_COLLECTORS, documented.keys() ^ here.keys()
    actual_line = next(line for line in result.stdout.splitlines() if line.startswith("collectors: "))
    assert actual_line == f"collectors: {ok + skipped - len(here)} ok, {len(here)} skipped"
