#!/usr/bin/env python3
"""The exporter's /metrics server under concurrent scrapers, side by side with prometheus_client's own.

Each server runs in its own process serving the same synthetic report (8 TPU chips, 20 agent jobs: the
exporter's real ReportCollector). An asyncio client in this process runs C scrapers for D seconds each,
every scrape a new connection (`Connection: close`, so the listen backlog is exercised), 10 s timeout;
optionally with 1,000 idle connections held open by another process (each reopened a second after the
server closes it). Servers alternate cell by cell. Targets for tpu-tools: 32 scrapers 0 errors and
p99 < 50 ms; 128 scrapers 0 errors.

    python benchmarks/exporter_load.py [--seconds 10] [--scrapers 1,8,32,128] [--idle 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

SERVERS = ("tpu-tools", "prometheus_client")
REQUEST = b"GET /metrics HTTP/1.1\r\nHost: exporter\r\nConnection: close\r\n\r\n"


def report() -> Any:
    from fleet_view import host_document
    from harness import monitor_report

    data = host_document(3, 8)
    agent = data["processes"]["agents"][0]
    data["processes"]["agents"] = [{**agent, "pid": 2000 + i, "tag": f"job{i}"} for i in range(20)]
    return monitor_report(data)


def serve(kind: str, port_file: Path) -> None:
    """The server process: print nothing, write the port, serve until killed."""
    from prometheus_client.registry import CollectorRegistry

    from tpu_tools.exporter.prometheus import BUILTIN, ReportCollector

    collector = ReportCollector(dict(BUILTIN))
    collector.update(report())
    if kind == "tpu-tools":
        from tpu_tools.exporter.webserver import serve_metrics

        port = serve_metrics(collector, "127.0.0.1", 0).server_address[1]
    else:
        from prometheus_client import start_http_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        port = start_http_server(0, addr="127.0.0.1", registry=registry)[0].server_address[1]
    port_file.write_text(str(port))
    while True:
        time.sleep(3600)


def start_server(kind: str, workdir: Path) -> tuple[subprocess.Popen, int]:
    port_file = workdir / f"{kind}.port"
    process = subprocess.Popen([sys.executable, __file__, "--serve", kind, "--port-file", str(port_file)],
                               stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (port_file.exists() and port_file.read_text()):
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the {kind} server did not start")
        time.sleep(0.05)
    return process, int(port_file.read_text())


async def one_scrape(port: int) -> float:
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(REQUEST)
        body = await reader.read()  # until the server closes
    finally:
        writer.close()
    if not body.startswith(b"HTTP/1.1 200") and not body.startswith(b"HTTP/1.0 200"):
        raise ConnectionError(body[:40])
    if b"tpu_tools_process_steps_total" not in body:
        raise ConnectionError("short body")
    return time.perf_counter() - started


async def scraper(port: int, until: float, latencies: list[float], errors: list[str]) -> None:
    while time.perf_counter() < until:
        try:
            latencies.append(await asyncio.wait_for(one_scrape(port), timeout=10))
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as error:
            errors.append(type(error).__name__)


async def idler(port: int) -> None:
    """Holds a connection open, sending nothing; reopens it a second after the server closes it."""
    while True:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(1)
            continue
        try:
            await reader.read()
        except OSError:
            pass
        finally:
            writer.close()
        await asyncio.sleep(1)


def hold(port: int, count: int) -> None:
    """The idle-connections process: runs until killed."""
    async def run() -> None:
        await asyncio.gather(*(idler(port) for _ in range(count)))

    asyncio.run(run())


def server_figures(pid: int) -> tuple[int, int]:
    """Threads and open sockets of the server process."""
    threads = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("Threads:"))
    sockets = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            sockets += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:  # closed meanwhile
            pass
    return threads, sockets


async def cell(port: int, pid: int, scrapers: int, idle: int, seconds: float) -> dict:
    holder = None
    if idle:
        holder = subprocess.Popen([sys.executable, __file__, "--hold", str(idle), "--port", str(port)],
                                  stdin=subprocess.DEVNULL)
        await asyncio.sleep(3)  # let them connect
    latencies: list[float] = []
    errors: list[str] = []
    until = time.perf_counter() + seconds
    figures = []

    async def watch() -> None:
        while time.perf_counter() < until:
            await asyncio.sleep(seconds / 3)
            figures.append(server_figures(pid))

    await asyncio.gather(watch(), *(scraper(port, until, latencies, errors) for _ in range(scrapers)))
    if holder is not None:
        holder.kill()
        holder.wait()
    latencies.sort()

    def at(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e3 if latencies else float("nan")

    return {"scrapes": len(latencies), "errors": len(errors), "rate": len(latencies) / seconds,
            "p50": at(0.5), "p99": at(0.99), "max": at(1.0), "threads": max(f[0] for f in figures),
            "sockets": max(f[1] for f in figures),
            "median": statistics.median(latencies) * 1e3 if latencies else float("nan")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--scrapers", default="1,8,32,128")
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    parser.add_argument("--port-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--hold", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hold:
        hold(args.port, args.hold)
        return 0
    if args.serve:
        serve(args.serve, args.port_file)
        return 0
    import tempfile

    workdir = Path(tempfile.mkdtemp(prefix="exporterload"))
    servers = {kind: start_server(kind, workdir) for kind in SERVERS}
    print(f"# benchmarks/exporter_load.py --seconds {args.seconds:g} --scrapers {args.scrapers} --idle {args.idle}"
          f"  (new connection per scrape, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})")
    print("| server | scrapers | idle connections | scrapes/s | errors | p50 ms | p99 ms | max ms "
          "| server threads | server sockets |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    try:
        for idle in sorted({0, args.idle}):
            for scrapers in (int(n) for n in args.scrapers.split(",")):
                for kind in SERVERS:
                    process, port = servers[kind]
                    result = asyncio.run(cell(port, process.pid, scrapers, idle, args.seconds))
                    print(f"| {kind} | {scrapers} | {idle} | {result['rate']:.0f} | {result['errors']} of "
                          f"{result['scrapes'] + result['errors']} | {result['p50']:.1f} | {result['p99']:.1f} | "
                          f"{result['max']:.0f} | {result['threads']} | {result['sockets']} |", flush=True)
    finally:
        for process, _ in servers.values():
            process.kill()
            process.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
