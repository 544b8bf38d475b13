"""The exporter's --web-config: TLS and basic auth checked with a real TLS client, and bad files refused."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest
from agentjobs import agent_env, rundir, wait_for  # noqa: F401 (rundir is a fixture)
from conftest import assert_one_line_error, run_tool, tool_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from promstack import free_port

from tpu_tools.errors import UsageError
from tpu_tools.exporter.webconfig import Authenticator, load_web_config

PASSWORD = "s3cret scrape"


def certificate(directory: Path, name: str = "tls") -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tpu-tools test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                               x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                  critical=False)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def _hash(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()  # cheap rounds: a test


@pytest.fixture
def secured(tmp_path, rundir):  # noqa: F811 (the rundir fixture)
    cert, _ = certificate(tmp_path)
    config = tmp_path / "web.yml"
    config.write_text(f"tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"
                      f"basic_auth_users:\n  prometheus: '{_hash(PASSWORD)}'\n")
    port = free_port()
    process = subprocess.Popen([*tool_command("tpu-monitor"), "--prometheus", f"127.0.0.1:{port}", "--quiet",
                                "--period", "0.2", "--web-config", str(config)],
                               env=agent_env(rundir), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    context = ssl.create_default_context(cafile=str(cert))
    try:
        yield f"https://127.0.0.1:{port}", context, process
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def _get(url: str, context: ssl.SSLContext | None, user: str | None = None, password: str = "") -> tuple[int, str]:
    request = urllib.request.Request(url)
    if user is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, ""


def test_tls_and_basic_auth_with_a_real_client(secured):
    url, context, process = secured

    def answered():
        try:
            return _get(url + "/metrics", context, "prometheus", PASSWORD)
        except OSError:
            assert process.poll() is None, process.stderr.read()
            return None

    status, text = wait_for(lambda: (lambda r: r if r and "tpu_tools_host_cpu_percent" in r[1] else None)(answered()))
    assert status == 200
    assert "tpu_tools_group_error" in text
    assert _get(url + "/metrics", context)[0] == 401
    assert _get(url + "/metrics", context, "prometheus", "wrong")[0] == 401
    assert _get(url + "/metrics", context, "nobody", PASSWORD)[0] == 401
    for _ in range(20):  # remembered after the first bcrypt check: repeated scrapes stay fast
        assert _get(url + "/metrics", context, "prometheus", PASSWORD)[0] == 200
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):  # a client that does not trust it
        _get(url + "/metrics", ssl.create_default_context())
    with pytest.raises((ConnectionError, urllib.error.URLError, OSError)):  # plain HTTP on the TLS port
        _get(url.replace("https", "http") + "/metrics", None, "prometheus", PASSWORD)
    assert _get(url + "/metrics", context, "prometheus", PASSWORD)[0] == 200  # still serving


def test_client_certificates_are_required_when_asked(tmp_path, rundir):  # noqa: F811
    server_cert, _ = certificate(tmp_path, "tls")
    client_cert, client_key = certificate(tmp_path, "client")
    config = tmp_path / "web.yml"
    config.write_text("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"
                      "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: client.crt\n")
    port = free_port()
    process = subprocess.Popen([*tool_command("tpu-monitor"), "--prometheus", f"127.0.0.1:{port}", "--quiet",
                                "--period", "0.2", "--web-config", str(config)], env=agent_env(rundir),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with_cert = ssl.create_default_context(cafile=str(server_cert))
        with_cert.load_cert_chain(str(client_cert), str(client_key))
        url = f"https://127.0.0.1:{port}/metrics"
        status, _ = wait_for(lambda: _try(url, with_cert))
        assert status == 200
        with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError, OSError)):
            _get(url, ssl.create_default_context(cafile=str(server_cert)))
    finally:
        process.terminate()
        process.wait(timeout=20)


def _try(url: str, context: ssl.SSLContext):
    try:
        return _get(url, context)
    except OSError:
        return None


@pytest.mark.parametrize(("text", "fragment"), [
    ("tls_server_config: [unclosed\n", "is not valid YAML (line"),
    ("tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n",
     "missing.crt does not exist"),
    ("basic_auth_users:\n  prometheus: hunter2\n", "the password of user 'prometheus' is not a bcrypt hash"),
    ("basic_auth_user:\n  prometheus: x\n", "unknown key 'basic_auth_user'"),
    ("tls_server_config:\n  cert_file: tls.crt\n", "tls_server_config.key_file is required"),
    ("- a list\n", "expected a mapping"),
    ("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.crt\n", "cannot use cert_file"),
], ids=["yaml", "missing-file", "plain-password", "unknown-key", "no-key", "not-a-mapping", "bad-key"])
def test_bad_web_config_is_one_line_at_start_exit_2(tmp_path, text, fragment):
    certificate(tmp_path)
    config = tmp_path / "web.yml"
    config.write_text(text)
    result = run_tool("tpu-monitor", "--prometheus", str(free_port()), "--quiet", "--count", "1",
                      "--web-config", str(config))
    assert_one_line_error(result, 2, fragment)


def test_web_config_needs_prometheus_and_an_existing_file(tmp_path):
    assert_one_line_error(run_tool("tpu-monitor", "--count", "1", "--web-config", str(tmp_path / "x.yml")), 2,
                          "--web-config only makes sense with --prometheus")
    assert_one_line_error(run_tool("tpu-monitor", "--prometheus", str(free_port()), "--count", "1",
                                   "--web-config", str(tmp_path / "absent.yml")), 2, "does not exist")


def test_authenticator_remembers_only_what_matched():
    auth = Authenticator({"me": _hash("pw").encode()})
    header = "Basic " + base64.b64encode(b"me:pw").decode()
    assert auth.check(header)
    assert auth.check(header)
    assert not auth.check("Basic " + base64.b64encode(b"me:pw2").decode())
    assert not auth.check("Basic !!!")
    assert not auth.check(None)
    assert not auth.check("Bearer x")
    assert Authenticator({}).check(None)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=300) | st.builds(
    lambda key, value: f"{key}:\n  {value}\n",
    st.sampled_from(["tls_server_config", "basic_auth_users", "http_server_config", "other"]),
    st.text(max_size=60)))
def test_any_file_loads_or_is_a_usage_error(tmp_path, text):
    path = tmp_path / "web.yml"
    path.write_bytes(text.encode("utf-8", "replace"))
    try:
        load_web_config(path)
    except UsageError as error:
        assert "\n" not in str(error)
        assert str(error).startswith(f"--web-config {path}")
