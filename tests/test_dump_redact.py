"""Redaction rules: every kind of secret goes, ordinary diagnostics stay, counts never hold values."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tpu_tools.dump.redact import MARK, Redactor, credential_paths, is_secret_name, looks_random


@pytest.mark.parametrize(("text", "secret", "kind"), [
    ("export HF_API_KEY=abc123secretvalue", "abc123secretvalue", "secret_variable"),
    ("DB_PASSWORD='two words'", "two words", "secret_variable"),
    ("git clone https://alice:s3cr3t-pw@git.example.com/repo.git", "s3cr3t-pw", "url_credentials"),
    ("pip index https://ghtoken123@pypi.example.com/simple", "ghtoken123", "url_credentials"),
    ("Authorization: Bearer ya-token.part-2.xyz", "ya-token.part-2.xyz", "bearer_token"),
    ('{"client_secret": "shh-its-secret", "n": 1}', "shh-its-secret", "secret_value"),
    ("session_id: 0a1b2c3d", "0a1b2c3d", "secret_value"),
    ("python train.py --wandb-api-key deadbeefcafe --steps 10", "deadbeefcafe", "secret_value"),
    ("using hf_abcdefghijklmnopqrstuvwxyz0123 for downloads", "hf_abcdefghijklmnopqrstuvwxyz0123", "known_token"),
    ("aws AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE", "known_token"),
    ("blob kZ3vP9qLm2XcR7tYb4NwH8sJd6FgA1eQ end", "kZ3vP9qLm2XcR7tYb4NwH8sJd6FgA1eQ", "high_entropy"),
])
def test_each_kind_of_secret_is_replaced_and_counted(text, secret, kind):
    counts = Counter()
    result = Redactor().text(text, counts)
    assert secret not in result
    assert MARK in result
    assert counts[kind] >= 1, counts


def test_private_key_blocks_go_whole_even_inside_json():
    block = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA1234\nabcd\n-----END RSA PRIVATE KEY-----"
    counts = Counter()
    assert Redactor().text(f"key file:\n{block}\nafter", counts) == f"key file:\n{MARK}\nafter"
    document = json.dumps({"pem": block, "other": 1})
    redacted = Redactor().text(document, counts)
    assert "MIIEpAIBAAKCAQEA1234" not in redacted
    assert json.loads(redacted)["other"] == 1
    assert counts["private_key"] == 2


def test_json_stays_valid_when_non_string_values_are_redacted():
    document = json.dumps({"auth": None, "session_id": 12345, "api_key": "x", "keep": True})
    loaded = json.loads(Redactor().text(document))
    assert loaded == {"auth": MARK, "session_id": MARK, "api_key": MARK, "keep": True}


@pytest.mark.parametrize("text", [
    "/usr/local/lib/python3.11/site-packages/jaxlib/xla_extension.so",
    "/home/JohnDoe/Projects/MyModel/Checkpoints2024/Run17/step_000100",
    "sha256 2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881",
    "uuid 81bbacec-807a-496f-8574-d87116e753c2",
    "XLA_FLAGS=--xla_force_host_platform_device_count=8 --xla_dump_to=/tmp/xla",
    "jit_train_step-8b1a9953c4611296a827abf8c47804d7e6c8f3d1a8f72c6e",
    "NVIDIA-H100-80GB-HBM3-SXM5-PCIe-Gen5x16",
    "max_tokens: 100 and author: Jane, cache_key: abc",
    "tpu_driver.t1v-n-4e8f7c2a-w-0.root.log.INFO.20240101-120000.1234",
    "jax==0.10.2\njaxlib==0.10.2\nlibtpu==0.0.42",
])
def test_ordinary_diagnostics_are_left_alone(text):
    counts = Counter()
    assert Redactor().text(text, counts) == text
    assert not counts


def test_disabled_redactor_changes_nothing_but_still_refuses_credential_files(tmp_path):
    credentials = tmp_path / "sa.json"
    credentials.write_text("{}")
    redactor = Redactor(enabled=False, credential_paths=credential_paths(
        {"GOOGLE_APPLICATION_CREDENTIALS": str(credentials)}))
    assert redactor.text("password=hunter2") == "password=hunter2"
    assert redactor.env_value("MY_TOKEN", "abc") == "abc"
    assert redactor.is_credential_file(credentials)


def test_environment_values_by_name():
    redactor = Redactor()
    assert redactor.env_value("JAX_AUTH_TOKEN", "abc") == MARK
    assert redactor.env_value("TPU_NAME", "my-tpu") == "my-tpu"
    assert redactor.env_value("TPU_PROXY", "http://u:pw@proxy:3128") == f"http://{MARK}@proxy:3128"
    assert redactor.totals == Counter(secret_variable=1, url_credentials=1)
    assert is_secret_name("aws_secret_access_key")
    assert not is_secret_name("PWD")


def test_credential_files_by_variable_and_by_name(tmp_path):
    named = tmp_path / "innocent-name.json"
    named.write_text("{}")
    folder = tmp_path / "creds"
    folder.mkdir()
    paths = credential_paths({"GOOGLE_APPLICATION_CREDENTIALS": str(named), "MY_SECRET_DIR": str(folder),
                              "HOME": str(tmp_path), "JAX_PLATFORMS": "cpu"})
    redactor = Redactor(credential_paths=paths)
    assert redactor.is_credential_file(named)
    assert redactor.is_credential_file(folder / "anything.txt")
    for name in (".ssh/id_ed25519", "certs/server.pem", ".netrc", "gcloud/application_default_credentials.json"):
        assert redactor.is_credential_file(tmp_path / name), name
    assert not redactor.is_credential_file(tmp_path / "train.log")


def test_random_tokens_are_caught_reliably():
    import secrets

    caught = sum(looks_random(secrets.token_urlsafe(30)) for _ in range(500))
    assert caught >= 480  # the name- and prefix-based rules cover what the entropy rule misses


# -- secrets whatever their prefix or option style; version pins are not secrets ------------------------------

@pytest.mark.parametrize(("text", "secret"), [
    ("TF_VAR_db_pass=tf-pass-value-1", "tf-pass-value-1"),
    ("mysql -h db -p S3cretPw1 --db-pass V4lue-2 -u root", "S3cretPw1"),
    ("mysql -h db -p S3cretPw1 --db-pass V4lue-2 -u root", "V4lue-2"),
    ("mysql -pAttached3 -h db", "Attached3"),
    ("python3 serve.py --password=letmein-99 --steps 1", "letmein-99"),
    ("curl -u alice:curl-pw-77 https://example.com", "curl-pw-77"),
    ("wget --user=bob:wget-pw-88 https://example.com", "wget-pw-88"),
    ("git push https://oauth2:glpat-AbCdEfGhIjKlMnOpQrSt@gitlab.example.com/x.git", "glpat-AbCdEfGhIjKlMnOpQrSt"),
    ("token is glpat-AbCdEfGhIjKlMnOpQrSt", "glpat-AbCdEfGhIjKlMnOpQrSt"),
    ("stripe sk_live_4eC39HqLyjWDarjtT1zdp7dc", "sk_live_4eC39HqLyjWDarjtT1zdp7dc"),
    ("npm token npm_abcdefghijklmnopqrstuvwxyz0123456789", "npm_abcdefghijklmnopqrstuvwxyz0123456789"),
    ("google key AIzaSyA1234567890abcdefghijklmnopqrstuv", "AIzaSyA1234567890abcdefghijklmnopqrstuv"),
    ("db_pwd: pw-in-yaml-5", "pw-in-yaml-5"),
])
def test_secrets_in_command_lines_and_names_of_any_prefix(text, secret):
    assert secret not in Redactor().text(text)


@pytest.mark.parametrize("name", ["TF_VAR_db_pass", "MYSQL_PWD", "my_api_key", "CI_JOB_TOKEN", "db_secret"])
def test_secret_names_whatever_their_prefix(name):
    assert is_secret_name(name)
    assert Redactor().env_value(name, "v") == MARK


@pytest.mark.parametrize("text", [
    "google-auth==2.38.0\ngoogle-auth-oauthlib==1.2.1\nkeyring==25.0\npasslib==1.7.4\n",
    "docker run -p 8080:80 image",
    "ssh -p 22 host",
    "PWD=/home/alice OLDPWD=/tmp",
    "compass: north",
])
def test_version_pins_ports_and_the_working_directory_stay(text):
    assert Redactor().text(text) == text


def test_a_dump_redacts_holders_command_lines_and_keeps_package_pins(tmp_path):
    import gzip

    import sysroot
    from conftest import clean_env, run_tool
    from test_dump_cli import _members

    secrets = {"pass": "TfPassValue-123", "short": "MyShortP-456", "db": "DbPassValue-789", "curl": "CurlPw-321",
               "gitlab": "glpat-AbCdEfGhIjKlMnOpQrSt"}
    root = tmp_path / "root"
    host = sysroot.v4_host(root)
    host.process(sysroot.FakeProcess(2002, 1000, [
        "mysql", "-p", secrets["short"], f"--db-pass={secrets['db']}", "-e", f"curl -u a:{secrets['curl']}",
        f"--token={secrets['gitlab']}"], ["/dev/accel0"]))
    (root / "proc/2002/environ").write_bytes(f"TF_VAR_db_pass={secrets['pass']}\0TPU_NAME=t1\0".encode())
    output = tmp_path / "b.tar.gz"
    env = clean_env(TPU_TOOLS_SYSROOT=str(root), TF_VAR_db_pass=secrets["pass"], CI_TOKEN=secrets["gitlab"])
    result = run_tool("tpu-dump", "--only", "accelerators.discovery,software.env,software.packages", "-o",
                      str(output), env=env)
    assert result.returncode == 0, result.stderr
    stream = gzip.decompress(output.read_bytes())
    for label, secret in secrets.items():
        assert secret.encode() not in stream, label
    members = _members(output)
    assert b"2002" in members["accelerators/discovery.json"]
    assert b"mysql -p <redacted>" in stream
    packages = members["software/packages.txt"].decode()
    assert "==" in packages
    assert MARK not in packages
