"""The exporter against hostile input: web configs no client could ever connect to, and the first scrapes."""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from agentjobs import agent_env, running_job, wait_for
from conftest import assert_one_line_error, run_tool, tool_command
from promstack import free_port
from test_exporter_webconfig import certificate


def _start(config: Path) -> object:
    return run_tool("tpu-monitor", "--prometheus", f"127.0.0.1:{free_port()}", "--quiet", "--count", "1",
                    "--web-config", str(config))


def _library_speaks_tls11(tmp_path: Path) -> bool:
    """Whether this Python's TLS library can shake hands at TLS 1.0-1.1 at all (its security level decides),
    asked over a real socket pair."""
    cert, key = certificate(tmp_path, "probe")
    contexts = []
    for kind in (ssl.PROTOCOL_TLS_SERVER, ssl.PROTOCOL_TLS_CLIENT):
        context = ssl.SSLContext(kind)
        with warnings.catch_warnings():  # the versions are deprecated: that is the point
            warnings.simplefilter("ignore", DeprecationWarning)
            context.minimum_version, context.maximum_version = ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1
        contexts.append(context)
    server, client = contexts
    server.load_cert_chain(str(cert), str(key))
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    near, far = socket.socketpair()
    near.settimeout(10)
    far.settimeout(10)
    with near, far, ThreadPoolExecutor(1) as pool:
        served = pool.submit(server.wrap_socket, near, server_side=True)
        try:
            client.wrap_socket(far).close()
            spoke = True
        except ssl.SSLError:
            spoke = False
            far.close()  # the server's read ends
        try:
            served.result(timeout=20).close()
        except (ssl.SSLError, OSError):
            spoke = False
    return spoke


@pytest.mark.parametrize(("tls", "fragment"), [
    ("  min_version: TLS13\n  max_version: TLS12\n", "min_version TLS13 is above max_version TLS12"),
    ("  max_version: TLS11\n", "min_version TLS12 is above max_version TLS11: no TLS version is left to speak "
                               "(TLS12 is the default min_version)"),
    ("  client_ca_file: tls.crt\n", "client_ca_file is given but client_auth_type is NoClientCert"),
    ("  client_ca_file: tls.crt\n  client_auth_type: NoClientCert\n", "so no client would be checked"),
], ids=["min-above-max", "max-below-default-min", "ca-without-auth", "ca-with-no-client-cert"])
def test_an_impossible_web_config_is_refused_at_start(tmp_path: Path, tls: str, fragment: str) -> None:
    certificate(tmp_path)
    config = tmp_path / "web.yml"
    config.write_text("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n" + tls)
    assert_one_line_error(_start(config), 2, fragment)


def test_versions_the_tls_library_refuses_are_refused_at_start(tmp_path: Path) -> None:
    certificate(tmp_path)
    config = tmp_path / "web.yml"
    config.write_text("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n  min_version: TLS10\n"
                      "  max_version: TLS11\n")
    result = _start(config)
    if _library_speaks_tls11(tmp_path):  # an older OpenSSL, or one at security level 0
        assert result.returncode == 0, result.stderr
    else:
        assert_one_line_error(result, 2, "no TLS handshake is possible with TLS10 to TLS11")
    assert ssl.HAS_TLSv1_2  # and the versions every exporter speaks do shake hands here
    config.write_text("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n  min_version: TLS12\n"
                      "  max_version: TLS13\n")
    result = _start(config)
    assert result.returncode == 0, result.stderr


def _scrape(port: int) -> tuple[int, bytes, str | None]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)  # a hang guard
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        return response.status, response.read(), response.getheader("Retry-After")
    finally:
        connection.close()


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return False
    return True


def test_scrapes_from_the_first_instant_never_get_an_empty_200() -> None:
    with running_job(light=True) as (_job, rundir):
        port = free_port()
        monitor = subprocess.Popen([*tool_command("tpu-monitor"), "--prometheus", f"127.0.0.1:{port}", "--quiet",
                                    "--period", "1"], env=agent_env(rundir), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: _accepts(port) or monitor.poll() is not None, timeout=60, interval=0.002)
            assert monitor.poll() is None, monitor.stderr.read() if monitor.stderr else ""
            with ThreadPoolExecutor(8) as pool:  # from the first instant: 8 clients, 5 scrapes each
                answers = list(pool.map(lambda _: [_scrape(port) for _ in range(5)], range(8)))
            for status, body, retry_after in (answer for client in answers for answer in client):
                if status == 503:  # the first round took longer than a scrape may wait for it
                    assert retry_after == "1"
                    assert b"No report yet" in body
                else:
                    assert status == 200, (status, body[:200])
                    assert b"tpu_tools_" in body, (status, body[:200])
            assert _scrape(port)[0] == 200 or wait_for(lambda: _scrape(port)[0] == 200, timeout=30)
        finally:
            monitor.terminate()
            try:
                monitor.wait(timeout=20)
            except subprocess.TimeoutExpired:
                monitor.kill()
                monitor.wait()
