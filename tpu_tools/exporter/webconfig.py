"""The exporter's --web-config file: TLS and basic auth, in the Prometheus exporter-toolkit format.

    tls_server_config:
      cert_file: /etc/tpu-tools/tls.crt
      key_file: /etc/tpu-tools/tls.key
      client_auth_type: RequireAndVerifyClientCert   # optional, with client_ca_file
      client_ca_file: /etc/tpu-tools/ca.crt
      min_version: TLS12                             # optional
    basic_auth_users:
      prometheus: $2y$10$...                         # bcrypt hashes only, never a password

Everything wrong with the file is a UsageError naming the file and the key, raised before anything is
served, so a bad deployment fails at start rather than serving in the clear. That includes the combinations
no client could use: a min_version above max_version, a client_ca_file that checks nobody (NoClientCert),
and versions or a certificate the TLS library cannot shake hands with (tried in memory at load).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tpu_tools.errors import UsageError
from tpu_tools.infile import InputFileError, check_input_file, read_input_file

CLIENT_AUTH_TYPES = ("NoClientCert", "RequestClientCert", "RequireAnyClientCert", "VerifyClientCertIfGiven",
                     "RequireAndVerifyClientCert")
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1, "TLS12": ssl.TLSVersion.TLSv1_2,
                "TLS13": ssl.TLSVersion.TLSv1_3}
MIN_BCRYPT_COST, MAX_BCRYPT_COST = 4, 16  # bcrypt's own floor; 16 is about 5 s of CPU a login
MAX_WEB_CONFIG_BYTES = 1 << 20  # a few users and three file names
MAX_TLS_FILE_BYTES = 1 << 20  # a certificate chain or a CA bundle: tens of KiB
_BCRYPT = re.compile(r"^\$2[abxy]?\$\d{2}\$[./A-Za-z0-9]{53}$")
_TOP_KEYS = ("tls_server_config", "basic_auth_users", "http_server_config")
_TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version",
             "cipher_suites", "curve_preferences", "prefer_server_cipher_suites")


@dataclass(frozen=True)
class TLSConfig:
    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"  # exporter-toolkit's default
    max_version: str | None = None


@dataclass(frozen=True)
class WebConfig:
    tls: TLSConfig | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash


def load_web_config(path: Path) -> WebConfig:
    """Read and check `path`; the TLS files are loaded once here so that a bad key fails now."""
    where = f"--web-config {path}"
    try:
        text = read_input_file(path, "--web-config", MAX_WEB_CONFIG_BYTES).decode("utf-8")
    except InputFileError as error:
        raise UsageError(str(error)) from None
    except UnicodeDecodeError:
        raise UsageError(f"{where} is not UTF-8 text") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        raise UsageError(f"{where} is not valid YAML{at}") from error
    except (ValueError, RecursionError) as error:  # an integer of thousands of digits, nesting beyond the stack
        raise UsageError(f"{where} is not a usable web config ({type(error).__name__})") from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise UsageError(f"{where}: expected a mapping with tls_server_config and basic_auth_users")
    unknown = [str(k) for k in document if k not in _TOP_KEYS]
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(_TOP_KEYS)})")
    tls = _tls(document.get("tls_server_config"), path, where)
    users = _users(document.get("basic_auth_users"), where)
    config = WebConfig(tls, users)
    if tls is not None:
        ssl_context(tls, where)
        check_handshake(tls, where)
    return config


def _tls(section: Any, path: Path, where: str) -> TLSConfig | None:
    if section is None:
        return None
    if not isinstance(section, dict):
        raise UsageError(f"{where}: tls_server_config must be a mapping")
    unknown = [str(k) for k in section if k not in _TLS_KEYS]
    if unknown:
        raise UsageError(f"{where}: unknown key tls_server_config.{unknown[0]}")
    if section.get("cipher_suites") or section.get("curve_preferences"):
        raise UsageError(f"{where}: cipher_suites and curve_preferences are not supported (Python's ssl chooses)")

    def file(key: str, required: bool) -> Path | None:
        value = section.get(key)
        if value is None or value == "":
            if required:
                raise UsageError(f"{where}: tls_server_config.{key} is required")
            return None
        if not isinstance(value, str):
            raise UsageError(f"{where}: tls_server_config.{key} must be a file name")
        found = Path(value) if Path(value).is_absolute() else path.parent / value  # relative to the file
        try:  # ssl reads it itself: a FIFO would block, a directory is not "missing"
            check_input_file(found, f"tls_server_config.{key}", MAX_TLS_FILE_BYTES)
        except InputFileError as error:
            raise UsageError(f"{where}: {error}") from None
        return found

    cert, key = file("cert_file", True), file("key_file", True)
    assert cert is not None and key is not None
    auth = section.get("client_auth_type") or "NoClientCert"
    if auth not in CLIENT_AUTH_TYPES:
        raise UsageError(f"{where}: tls_server_config.client_auth_type {auth!r} is not one of "
                         f"{', '.join(CLIENT_AUTH_TYPES)}")
    ca = file("client_ca_file", auth in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert"))
    if ca is not None and auth == "NoClientCert":  # as exporter-toolkit: a CA that checks nobody is a mistake
        raise UsageError(f"{where}: tls_server_config.client_ca_file is given but client_auth_type is NoClientCert, "
                         "so no client would be checked; set client_auth_type: RequireAndVerifyClientCert")
    versions = {}
    for name in ("min_version", "max_version"):
        value = section.get(name)
        if value is not None and value not in TLS_VERSIONS:
            raise UsageError(f"{where}: tls_server_config.{name} {value!r} is not one of {', '.join(TLS_VERSIONS)}")
        versions[name] = value
    low, high = versions["min_version"] or "TLS12", versions["max_version"]
    if high is not None and TLS_VERSIONS[low] > TLS_VERSIONS[high]:
        raise UsageError(f"{where}: tls_server_config.min_version {low} is above max_version {high}: no TLS "
                         "version is left to speak" + ("" if versions["min_version"] else
                                                       f" ({low} is the default min_version)"))
    return TLSConfig(cert, key, auth, ca, low, high)


def _users(section: Any, where: str) -> dict[str, bytes]:
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise UsageError(f"{where}: basic_auth_users must map user names to bcrypt hashes")
    users = {}
    for user, hashed in section.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise UsageError(f"{where}: basic_auth_users: {user!r} is not a user name")
        if not isinstance(hashed, str) or not _BCRYPT.match(hashed):
            raise UsageError(f"{where}: the password of user {user!r} is not a bcrypt hash (store the hash, e.g. "
                             f"from `htpasswd -nbBC 10 '' PASSWORD`, never the password)")
        cost = int(hashed.split("$")[2])
        if not MIN_BCRYPT_COST <= cost <= MAX_BCRYPT_COST:
            raise UsageError(f"{where}: the bcrypt cost of user {user!r} is {cost}; use {MIN_BCRYPT_COST} to "
                             f"{MAX_BCRYPT_COST} (each step doubles the CPU time of every login: cost 31 takes days)")
        users[user] = hashed.encode()
    return users


def _versions(context: ssl.SSLContext, tls: TLSConfig) -> ssl.SSLContext:
    context.minimum_version = TLS_VERSIONS[tls.min_version]
    if tls.max_version:
        context.maximum_version = TLS_VERSIONS[tls.max_version]
    return context


def check_handshake(tls: TLSConfig, where: str = "--web-config", rounds: int = 8) -> None:
    """Shake hands in memory with the file's versions and certificate: a combination the TLS library cannot
    speak (TLS11 as the highest version where OpenSSL's security level refuses it, a key no cipher of those
    versions signs with) is refused now rather than served to clients that can never connect."""
    server = _versions(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), tls)
    server.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    client = _versions(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), tls)
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE  # the pairing, not the trust, is in question
    to_server, to_client, from_client, from_server = (ssl.MemoryBIO() for _ in range(4))
    sides = [client.wrap_bio(to_client, from_client, server_side=False),
             server.wrap_bio(to_server, from_server, server_side=True)]
    done = [False, False]
    try:
        for _ in range(rounds):
            for index, side in enumerate(sides):
                if not done[index]:
                    try:
                        side.do_handshake()
                        done[index] = True
                    except ssl.SSLWantReadError:
                        pass
            to_server.write(from_client.read())
            to_client.write(from_server.read())
            if all(done):
                return
    except ssl.SSLError as error:
        versions = f"{tls.min_version} to {tls.max_version or 'the highest'}"
        raise UsageError(f"{where}: no TLS handshake is possible with {versions} and this certificate in this TLS "
                         f"library ({error.reason or error}); choose other tls_server_config versions") from None
    raise UsageError(f"{where}: a TLS handshake with {tls.min_version} to {tls.max_version or 'the highest'} did not "
                     "finish")


def ssl_context(tls: TLSConfig, where: str = "--web-config") -> ssl.SSLContext:
    context = _versions(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), tls)
    try:
        context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    except (ssl.SSLError, OSError) as error:
        raise UsageError(f"{where}: cannot use cert_file {tls.cert_file} with key_file {tls.key_file} "
                         f"({getattr(error, 'reason', None) or error})") from error
    if tls.client_auth_type != "NoClientCert":
        verify = tls.client_auth_type in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
        required = tls.client_auth_type in ("RequireAnyClientCert", "RequireAndVerifyClientCert")
        if verify and tls.client_ca_file is not None:
            try:
                context.load_verify_locations(cafile=str(tls.client_ca_file))
            except (ssl.SSLError, OSError) as error:
                raise UsageError(f"{where}: cannot use client_ca_file {tls.client_ca_file} ({error})") from error
        # Python verifies any certificate it asks for; "any client cert" without a CA is not possible.
        if not verify:
            raise UsageError(f"{where}: client_auth_type {tls.client_auth_type} needs certificates checked "
                             "against client_ca_file; use VerifyClientCertIfGiven or RequireAndVerifyClientCert")
        context.verify_mode = ssl.CERT_REQUIRED if required else ssl.CERT_OPTIONAL
    return context


class Authenticator:
    """Checks `Authorization: Basic` headers against the bcrypt hashes, remembering the pairs that matched:
    bcrypt costs tens of milliseconds by design, and Prometheus sends the same credentials every scrape."""

    def __init__(self, users: dict[str, bytes]):
        self.users = users
        self._good: set[bytes] = set()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self.users)

    def _credentials(self, header: str | None) -> tuple[bytes, str, bytes] | None:
        """(bcrypt hash, password, key of the pair) of a Basic header naming a known user."""
        if not header or not header.startswith("Basic "):
            return None
        import base64
        import binascii

        try:
            user, _, password = base64.b64decode(header[6:].strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        hashed = self.users.get(user)
        if hashed is None:
            return None
        return hashed, password, hashlib.sha256(hashed + b"\0" + password.encode()).digest()

    def remembered(self, header: str | None) -> bool:
        """True when no user is configured or these credentials matched before (no bcrypt: cheap)."""
        if not self.users:
            return True
        found = self._credentials(header)
        if found is None:
            return False
        with self._lock:
            return any(hmac.compare_digest(found[2], good) for good in self._good)

    def check(self, header: str | None) -> bool:
        if self.remembered(header):
            return True
        found = self._credentials(header)
        if found is None:
            return False
        hashed, password, key = found
        import bcrypt

        try:
            matched = bcrypt.checkpw(password.encode(), hashed)
        except ValueError:
            return False
        if matched:
            with self._lock:
                self._good.add(key)
        return matched
