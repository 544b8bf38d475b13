"""The dump's parts in-process: the forked runner's faults, collectors on fixture hosts, size fitting, reading."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
import sysroot
from conftest import clean_env
from dump_fixtures import file_member, plant_logs, system_files, tar_gz, write

from tpu_tools.dump import collectors as registry
from tpu_tools.dump.bundle import top_folder
from tpu_tools.dump.collector import TRIM_TAIL, Collector, DumpOptions, Skipped
from tpu_tools.dump.collectors.software import stack_checks, xla_dump_folder
from tpu_tools.dump.create import DumpRequest, create_bundle
from tpu_tools.dump.findings import summarize
from tpu_tools.dump.reader import Bundle, BundleError
from tpu_tools.dump.redact import Redactor
from tpu_tools.dump.runner import fork_is_safe, run_collectors
from tpu_tools.pjrt.runtime import RuntimePolicy


def _options(root: Path, timeout_s: float = 10, add: tuple[str, ...] = ()) -> DumpOptions:
    return DumpOptions(root=root, policy=RuntimePolicy(platform="cpu"), timeout_s=timeout_s, add_paths=add)


def _run(names: list[str], root: Path, **kwargs):
    chosen = [c for c in registry.COLLECTORS if c.name in names]
    results = run_collectors(chosen, _options(root, **kwargs), Redactor())
    return {r.name: r for r in results}


def _json(result, name: str):
    return json.loads(next(f.data for f in result.files if f.name == name))


def _no_children_left() -> None:
    for _ in range(50):
        alive = [c for c in psutil.Process().children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return
        time.sleep(0.1)
    raise AssertionError(f"collector processes left behind: {alive}")


# --- the runner's faults ----------------------------------------------------------------------------

def _raises(ctx):
    ctx.add_text("partial/before.txt", "written before the error\n")
    raise RuntimeError("the collector broke")


def _blocks_on_fifo(ctx):
    ctx.add_text("partial/before.txt", "written before the hang\n")
    with open(ctx.root / "fifo"):  # no writer: open() blocks for ever
        pass


def _crashes(ctx):
    import faulthandler

    faulthandler.disable()  # pytest's handler would print the crash; the runner reports it
    os.kill(os.getpid(), signal.SIGSEGV)


def _skips(ctx):
    raise Skipped("nothing here")


def test_a_raising_a_hanging_and_a_crashing_collector_cost_only_themselves(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    collectors = [Collector("test.raises", "", _raises), Collector("test.hangs", "", _blocks_on_fifo),
                  Collector("test.crashes", "", _crashes), Collector("test.skips", "", _skips),
                  *[c for c in registry.COLLECTORS if c.name == "software.python"]]
    # The hanging collector never ends by itself: its status shows the runner's timeout ended it.
    results = {r.name: r for r in run_collectors(collectors, _options(tmp_path, timeout_s=5), Redactor())}
    raised = results["test.raises"]
    assert (raised.status, raised.error) == ("failed", "RuntimeError: the collector broke")
    assert "Traceback" in raised.traceback
    assert [f.name for f in raised.files] == ["partial/before.txt"]
    hung = results["test.hangs"]
    assert hung.status == "timed_out"
    assert "did not finish within 5 s" in hung.error
    assert [f.data for f in hung.files] == [b"written before the hang\n"]  # what it sent before hanging is kept
    assert results["test.crashes"].status == "failed"
    assert "killed by SIGSEGV" in results["test.crashes"].error
    assert (results["test.skips"].status, results["test.skips"].error) == ("skipped", "nothing here")
    assert results["software.python"].status == "ok"
    _no_children_left()


def test_a_caller_with_threads_gets_fresh_interpreters_that_keep_every_guarantee(tmp_path):
    # A process running other threads (XLA's pools, a server) must not fork: each collector runs in a spawned
    # interpreter, with the same deadline, partial files and crash reports.
    os.mkfifo(tmp_path / "fifo")
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        assert not fork_is_safe()
        collectors = [Collector("test.raises", "", _raises), Collector("test.hangs", "", _blocks_on_fifo),
                      Collector("test.crashes", "", _crashes),
                      Collector("test.lambda", "", lambda ctx: ctx.add_text("x.txt", "x"))]
        results = {r.name: r for r in run_collectors(collectors, _options(tmp_path, timeout_s=1.5), Redactor())}
    finally:
        stop.set()
        thread.join()
    assert (results["test.raises"].status, results["test.raises"].error) == ("failed",
                                                                             "RuntimeError: the collector broke")
    assert [f.name for f in results["test.raises"].files] == ["partial/before.txt"]
    assert results["test.hangs"].status == "timed_out"
    assert [f.data for f in results["test.hangs"].files] == [b"written before the hang\n"]
    assert "killed by SIGSEGV" in results["test.crashes"].error
    lost = results["test.lambda"]  # a lambda cannot reach another interpreter: that collector alone fails
    assert lost.status == "failed"
    assert "cannot be sent to a fresh process" in lost.error
    _no_children_left()


def test_a_process_that_started_jax_dumps_without_forking_it(tmp_path):
    script = textwrap.dedent("""
        import jax, sys
        jax.devices()
        from tpu_tools.dump import collectors as registry
        from tpu_tools.dump.collector import DumpOptions
        from tpu_tools.dump.redact import Redactor
        from tpu_tools.dump.runner import run_collectors
        from tpu_tools.pjrt.runtime import RuntimePolicy
        chosen = [c for c in registry.COLLECTORS if c.name == "software.python"]
        options = DumpOptions(root=__import__("pathlib").Path("/"), policy=RuntimePolicy(platform="cpu"),
                              timeout_s=30)
        print([r.status for r in run_collectors(chosen, options, Redactor())])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=clean_env(JAX_PLATFORMS="cpu"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['ok']"
    assert "fork" not in done.stderr, done.stderr


# --- collectors on fixture hosts ----------------------------------------------------------------------

def test_system_collectors_read_the_fixture_root(tmp_path):
    sysroot.v4_host(tmp_path)
    system_files(tmp_path)
    device = tmp_path / "sys/bus/pci/devices/0000:00:04.0"
    os.symlink("../../../bus/pci/drivers/vfio-pci", device / "driver")
    write(device, "current_link_speed", "16.0 GT/s PCIe\n")
    write(device, "current_link_width", "16\n")
    results = _run(["system.os", "system.cpu", "system.memory", "system.cgroup", "system.modules", "system.pci",
                    "system.uptime", "system.cmdline"], tmp_path)
    assert all(r.status == "ok" for r in results.values()), {n: r.error for n, r in results.items()}
    assert _json(results["system.os"], "system/os.json")["pretty_name"] == "Ubuntu 22.04.4 LTS"
    cpu = _json(results["system.cpu"], "system/cpu.json")
    assert (cpu["logical_cpus"], cpu["physical_cores"], cpu["sockets"]) == (8, 8, 2)
    assert cpu["model"].startswith("Intel(R) Xeon(R) Platinum")
    assert "amx_tile" in cpu["vector_extensions"]
    assert _json(results["system.memory"], "system/memory.json")["total_bytes"] == 16384000 * 1024
    cgroup = _json(results["system.cgroup"], "system/cgroup.json")
    assert cgroup["version"] == 2
    assert cgroup["limits"]["memory.max"] == "8589934592"
    assert cgroup["oom_kills"] == 2
    modules = _json(results["system.modules"], "system/modules.json")
    assert [m["name"] for m in modules["loaded"]] == ["vfio_pci", "vfio"]
    pci = _json(results["system.pci"], "system/pci.json")["functions"]
    assert [f["chip"] for f in pci] == ["TPU v4"] * 4
    assert pci[0]["driver"] == "vfio-pci"
    assert pci[0]["link_current"] == "16.0 GT/s PCIe x16"
    assert _json(results["system.uptime"], "system/uptime.json")["load_1m"] == 1.5


def test_discovery_records_holder_state_and_show_warns_about_dead_holders(tmp_path, monkeypatch):
    sysroot.v4_host(tmp_path, holders={2001: [0], 2002: [1]})
    for pid, state in ((2001, "Z (zombie)"), (2002, "D (disk sleep)")):
        with open(tmp_path / f"proc/{pid}/status", "a") as status:
            status.write(f"State:\t{state}\n")
    monkeypatch.setenv("TPU_TOOLS_SYSROOT", str(tmp_path))
    bundle = create_bundle(DumpRequest(output=tmp_path / "b.tar.gz", only=("accelerators.discovery",)))
    with Bundle(bundle.path) as opened:
        discovery = opened.read_json("accelerators/discovery.json")
        assert discovery["chips"][0]["holders"][0]["state"] == "Z"
        kinds = {w.kind: w.message for w in summarize(opened).warnings}
    assert kinds["dead_holder"].startswith("/dev/accel0 is held by process 2001 (/usr/bin/python3), which has "
                                           "exited (zombie) but still has them open")
    assert kinds["stuck_holder"].startswith("/dev/accel1 is held by process 2002")


def test_libtpu_logs_are_tailed_inside_their_folder_only(tmp_path):
    logs = plant_logs(tmp_path)
    os.mkfifo(logs / "pipe.log")
    result = _run(["logs.libtpu"], tmp_path)["logs.libtpu"]
    assert result.status == "ok"
    names = sorted(f.name for f in result.files)
    assert names == ["logs/libtpu/index.json", "logs/libtpu/tpu_driver.vm.root.log.INFO.20250101-120000.1"]
    index = _json(result, "logs/libtpu/index.json")
    reasons = {s["path"]: s["reason"] for s in index["skipped"]}
    assert "leaves" in reasons["leak.log"]
    assert "not followed" in reasons["leak.log"]
    assert "no such file" in reasons["dangling.log"]
    assert reasons["pipe.log"] == "a FIFO; not read"
    log = next(f for f in result.files if f.name.endswith(".1"))
    assert b"DEADLINE_EXCEEDED" in log.data
    assert log.trim == TRIM_TAIL
    assert log.redactions
    assert b"hunter2" not in log.data
    assert any("leaves" in note for note in result.notes)


def test_added_folder_follows_links_inside_never_outside_and_skips_credentials(tmp_path):
    tree = tmp_path / "run"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub/train.log").write_text("step 1 loss 2.0\n")
    os.symlink("sub/train.log", tree / "latest.log")
    (tmp_path / "secret.txt").write_text("outside the tree\n")
    os.symlink(str(tmp_path / "secret.txt"), tree / "escape.txt")
    os.symlink("..", tree / "up")
    (tree / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----\n")
    result = _run(["logs.added"], tmp_path, add=(str(tree),))["logs.added"]
    contents = {f.name: f.data for f in result.files}
    assert contents["logs/added/1-run/sub/train.log"] == b"step 1 loss 2.0\n"
    assert not any(b"outside the tree" in data for data in contents.values())
    skipped = {s["path"]: s["reason"] for s in json.loads(contents["logs/added/index.json"])["paths"][0]["skipped"]}
    assert "leaves" in skipped["escape.txt"]
    assert "leaves" in skipped["up"]
    assert skipped["key.pem"] == "a credential file; never collected"


def test_stack_checks_find_versions_that_do_not_agree(tmp_path):
    def dist(name: str, version: str, *requires: str) -> tuple[str, str]:
        folder = tmp_path / f"{name}-{version}.dist-info"
        folder.mkdir()
        (folder / "METADATA").write_text(f"Name: {name}\nVersion: {version}\n"
                                         + "".join(f"Requires-Dist: {r}\n" for r in requires))
        return version, str(folder)

    installed = {
        "jax": dist("jax", "0.10.2", "jaxlib<=0.10.2,>=0.10.2", "numpy>=2.0", 'libtpu==0.0.42.*; extra == "tpu"',
                    'jaxlib<=0.10.2,>=0.10.2; extra == "tpu"'),
        "jaxlib": dist("jaxlib", "0.4.30"),
        "libtpu": dist("libtpu", "0.0.40"),
    }
    checks = {c["distribution"]: c for c in stack_checks(installed)}
    assert checks["jaxlib"]["ok"] is False
    assert checks["jaxlib"]["requirement"] == "jaxlib<=0.10.2,>=0.10.2"
    assert checks["libtpu"]["ok"] is False
    assert checks["libtpu"]["via_extras"] == ["tpu"]
    installed["jaxlib"] = dist("jaxlib", "0.10.2")
    installed["libtpu"] = dist("libtpu", "0.0.42.1")
    assert all(c["ok"] for c in stack_checks(installed))


def test_compile_cache_and_xla_dump_settings(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    (cache / "sub").mkdir(parents=True)
    for i in range(3):
        (cache / "sub" / f"entry{i}").write_bytes(b"x" * 100)
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(cache))
    dump = tmp_path / "xla"
    dump.mkdir()
    (dump / "module_0001.jit_f.before_optimizations.txt").write_text("HloModule jit_f\n")
    monkeypatch.setenv("XLA_FLAGS", f"--xla_force_host_platform_device_count=2 --xla_dump_to={dump}")
    results = _run(["software.compile_cache", "software.xla_dump"], tmp_path)
    document = _json(results["software.compile_cache"], "software/compile_cache.json")
    assert (document["entry_count"], document["size_bytes"], document["writable"]) == (3, 300, True)
    assert document["owner_uid"] == os.getuid()
    assert document["mode"]
    names = [f.name for f in results["software.xla_dump"].files]
    assert "software/xla_dump/files/module_0001.jit_f.before_optimizations.txt" in names
    assert xla_dump_folder("--xla_dump_to=/a --xla_dump_to=/b") == "/b"
    assert xla_dump_folder("") is None


# --- fitting --max-size ------------------------------------------------------------------------------

def _big_logs(ctx):
    import random

    rng = random.Random(7)
    for name, size in (("big.log", 600_000), ("medium.log", 300_000), ("small.log", 20_000)):
        lines = "".join(f"{rng.getrandbits(64):016x} {rng.getrandbits(64):016x} line\n" for _ in range(size // 40))
        ctx.add_text(f"logs/{name}", lines, trim=TRIM_TAIL)
    ctx.add_json("facts.json", {"kept": "whole"})


def test_max_size_trims_the_largest_logs_first_and_says_so(tmp_path):
    report = create_bundle(DumpRequest(output=tmp_path / "b.tar.gz", max_size_bytes=300_000),
                           collectors=[Collector("test.logs", "", _big_logs)])
    assert report.size_bytes <= 300_000 == report.manifest.options["max_size_bytes"]
    assert not report.over_max_size
    files = {f.name: f for f in report.manifest.files or []}
    assert files["logs/big.log"].trimmed_from_bytes
    assert files["logs/medium.log"].trimmed_from_bytes
    assert files["logs/small.log"].trimmed_from_bytes is None  # below the common length: untouched
    assert files["facts.json"].trimmed_from_bytes is None
    assert any("trimmed" in (note or "") for note in report.manifest.notes or [])
    with Bundle(report.path) as opened:
        big = opened.read("logs/big.log").decode()
        assert big.startswith("[tpu-dump: trimmed to the last ")
        assert big.endswith(" line\n")
        assert opened.integrity_problems() == []


# --- reading ----------------------------------------------------------------------------------------

def test_reader_reports_oversized_members_without_reading_them(tmp_path):
    manifest = json.dumps({"schema": "tpu-tools/dump/v1", "files": []}).encode()
    path = tmp_path / "b.tar.gz"
    path.write_bytes(tar_gz([file_member("b/manifest.json", manifest), file_member("b/huge.bin", b"\0" * 5000)]))
    with Bundle(path, max_member_bytes=4096) as opened:
        huge = opened.member("huge.bin")
        assert "over the 4096-byte limit" in huge.problem
        with pytest.raises(BundleError, match="over the 4096-byte limit"):
            opened.read("huge.bin")
        assert opened.top == "b"
        assert top_folder(path) == "b"


def test_reader_refuses_a_tar_without_manifest(tmp_path):
    path = tmp_path / "other.tar.gz"
    path.write_bytes(tar_gz([file_member("x/readme.txt", b"hello")]))
    with pytest.raises(BundleError, match="has no manifest.json"):
        Bundle(path)
    assert tarfile.is_tarfile(path)


def test_reader_refuses_a_huge_metadata_header_before_parsing_it(tmp_path):
    info, data = file_member("b/manifest.json", b"{}")
    info.pax_headers = {"comment": "x" * (2 << 20)}  # tarfile would read all of it into memory
    path = tmp_path / "bomb.tar.gz"
    path.write_bytes(tar_gz([(info, data)]))
    assert path.stat().st_size < 64 << 10
    with pytest.raises(BundleError, match=r"a pax header claims \d+ bytes"):
        Bundle(path)
