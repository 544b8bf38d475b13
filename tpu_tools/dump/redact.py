"""Redaction: what must never leave the machine in a support bundle.

Every byte a collector adds to a bundle passes through `Redactor.text` (or
`Redactor.env_value` for environment listings) before it is written anywhere,
so secrets never reach the disk, the archive or a temporary file. Replaced
values become `<redacted>`; each replacement is counted by kind, never
recorded. Files named by credential variables (GOOGLE_APPLICATION_CREDENTIALS,
...) and files that look like credential stores are never read at all.

The rules favour over-redaction: a support engineer can ask for a value again,
a leaked token cannot be taken back.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

MARK = "<redacted>"

# Environment variable names that suggest a secret value (matched as substrings, upper-cased), whatever
# their prefix: TF_VAR_db_pass is a Terraform variable, not TensorFlow's.
_SECRET_NAME_WORDS = ("TOKEN", "SECRET", "PASS", "PWD", "KEY", "CREDENTIAL", "AUTH", "SESSION", "COOKIE",
                      "PRIVATE", "SIGNATURE", "SALT", "APIKEY")
_SECRET_NAME = re.compile("|".join(_SECRET_NAME_WORDS))
_NOT_SECRET_NAMES = ("PWD", "OLDPWD")

# Variables that name credential files (besides every secret-named variable holding a path).
CREDENTIAL_FILE_VARIABLES = ("GOOGLE_APPLICATION_CREDENTIALS", "AWS_SHARED_CREDENTIALS_FILE",
                             "AWS_WEB_IDENTITY_TOKEN_FILE", "AZURE_FEDERATED_TOKEN_FILE", "KUBECONFIG", "NETRC",
                             "DOCKER_CONFIG", "CLOUDSDK_CONFIG", "PGPASSFILE", "HF_TOKEN_PATH")

# File and folder names that hold credentials whatever variable points at them.
_CREDENTIAL_FILE_NAMES = re.compile(
    r"^(id_(rsa|dsa|ecdsa|ed25519)(_sk)?|\.netrc|_netrc|\.git-credentials|\.pgpass|\.htpasswd|\.pypirc|\.npmrc"
    r"|token|credentials(\.json|\.db)?|application_default_credentials\.json|access_tokens\.db|legacy_credentials"
    r"|.*\.(pem|key|p12|pfx|jks|keystore|kdbx))$", re.IGNORECASE)
_CREDENTIAL_DIR_NAMES = {".ssh", ".gnupg", ".aws", ".docker", ".kube", "gcloud", ".azure"}

_PRIVATE_KEY = re.compile(
    r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY( BLOCK)?-----(?:.*?-----END [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----|[^\"]*)",
    re.DOTALL)
# scheme://user:password@host and scheme://token@host: the whole user part goes.
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^\s/@:\"'<>]+(?::[^\s/@\"'<>]*)?|:[^\s/@\"'<>]+)@")
_BEARER = re.compile(r"(?i)\b(bearer|basic|token|digest)(\s+)([A-Za-z0-9\-._~+/]{8,}=*)")
# NAME=value with a secret-looking NAME, as in `env`, shell scripts and kernel command lines ("==" is a
# comparison or a version pin, as in google-auth==2.38.0: never an assignment).
_ENV_ASSIGNMENT = re.compile(r"(?<![A-Za-z0-9_.=-])([A-Z][A-Za-z0-9_]*)=(?!=)(\"[^\"\n]*\"|'[^'\n]*'|[^\s\"',;]+)")
# key: value, key=value, "key": "value", --key=value, --key value for secret-looking keys in any case.
_SECRET_KEY_WORD = (r"(?:token|secret|passw(?:or)?d|passphrase|(?<![a-z])pass|(?<![a-z])pwd|api[_-]?key"
                    r"|access[_-]?key|secret[_-]?key|account[_-]?key|private[_-]?key|credentials?|auth|authorization"
                    r"|session[_-]?(?:id|key|token)|cookie)")
_KEY_VALUE = re.compile(
    r"(?i)(?<![A-Za-z0-9])([A-Za-z0-9_.-]*" + _SECRET_KEY_WORD + r"(?:[_.-][A-Za-z0-9_.-]*)?)"
    r"(\"?\s*[:=]\s*\"?|'?\s*[:=]\s*'?)(?!=)([^\s\"',;}<>]+)")
# The key-value rules try every word start; a text without any secret-looking word skips them (most logs).
_ANY_SECRET_KEY_WORD = re.compile("(?i)" + _SECRET_KEY_WORD)
_FLAG_VALUE = re.compile(r"(?i)(--[A-Za-z0-9-]*" + _SECRET_KEY_WORD + r"(?:-[A-Za-z0-9-]*)?)(\s+)([^\s-][^\s]*)")
# Tokens with published formats (the list follows detect-secrets' plugins and the vendors' documentation):
# GitHub, GitLab (personal, project, deploy, runner, trigger, feed, OAuth tokens), Hugging Face, Slack,
# OpenAI-style and Anthropic, Google OAuth and API keys, AWS access keys, JWTs, Stripe, Twilio, SendGrid,
# npm, PyPI, Docker Hub, DigitalOcean, Databricks, Shopify, Mailchimp, Discord and Telegram bots.
_KNOWN_TOKEN = re.compile(
    r"\b(gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|hf_[A-Za-z0-9]{20,}|xox[abposr]-[A-Za-z0-9-]{10,}"
    r"|gl(?:pat|ptt|dt|rt|ft|oas|soat|imt|agent|cbt)-[A-Za-z0-9_-]{20,}|GR1348941[A-Za-z0-9_-]{20,}"
    r"|sk-[A-Za-z0-9_-]{20,}|ya29\.[A-Za-z0-9_-]{20,}|AIza[0-9A-Za-z_-]{35}|(?:AKIA|ASIA)[0-9A-Z]{16}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
    r"|(?:sk|rk|pk)_(?:live|test)_[0-9A-Za-z]{16,}|SK[0-9a-fA-F]{32}|SG\.[\w-]{16,}\.[\w-]{16,}"
    r"|npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_-]{50,}|dckr_pat_[A-Za-z0-9_-]{20,}|do[por]_v1_[a-f0-9]{64}"
    r"|dapi[a-h0-9]{32}|shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}|[0-9a-f]{32}-us[0-9]{1,2}"
    r"|[MNO][A-Za-z\d_-]{23,25}\.[A-Za-z\d_-]{6}\.[A-Za-z\d_-]{27,}|[0-9]{8,10}:AA[0-9A-Za-z_-]{33})")
# Command-line options that carry a password in their value, whatever their name:
# `-p V` / `-pV` (mysql, sshpass...; port numbers like -p 8080 or -p 80:80 are kept), and the password half
# of `-u user:pass` / `--user user:pass` (curl, wget...).
_SHORT_PASSWORD = re.compile(r"(?<!\S)(-p)(\s+|=)?(?!\d+(?::\d+)*(?:/\w+)?(?:\s|$))(?!-)(?!<redacted>)([^\s]+)")
_USER_PASSWORD = re.compile(r"(?<!\S)(-u|--user|--proxy-user)(\s+|=)([^\s:]+):(?!<redacted>)([^\s]+)")
_AUTH_SCHEMES = ("bearer", "basic", "token", "digest")
_ENTROPY_CANDIDATE = re.compile(r"[A-Za-z0-9+/=_-]{32,}")
_MIN_ENTROPY_BITS = 4.0
_MIN_CLASS_SWITCH_RATIO = 0.3
_MAX_LONG_RUN_FRACTION = 0.5  # share of characters in runs of 4+ of one class (words, hex groups)


def _key_value_replacement(match: re.Match) -> str:
    key, separator, value = match.groups()
    if value == MARK or value.lower() in _AUTH_SCHEMES or key.upper() in _NOT_SECRET_NAMES:
        return match.group(0)
    if separator.startswith('"') and not separator.endswith('"'):
        return f'{key}{separator}"{MARK}"'  # a JSON number, true or null: keep the document valid
    return f"{key}{separator}{MARK}"


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's name suggests its value is a secret."""
    return bool(_SECRET_NAME.search(name.upper())) and name.upper() not in _NOT_SECRET_NAMES


def _entropy_bits(text: str) -> float:
    counts = Counter(text)
    return -sum(c / len(text) * math.log2(c / len(text)) for c in counts.values())


def _char_class(char: str) -> int:
    return 0 if char.islower() else 1 if char.isupper() else 2 if char.isdigit() else 3


def looks_random(token: str) -> bool:
    """A long string of mixed case and digits that switches character class like random data does.

    Paths, identifiers, hex digests and UUIDs (one case, long runs) are left alone.
    """
    stripped = token.strip("=-_/+")
    if len(stripped) < 32:
        return False
    upper = sum(c.isupper() for c in stripped)
    lower = sum(c.islower() for c in stripped)
    digits = sum(c.isdigit() for c in stripped)
    if upper < 3 or lower < 3 or digits < 2:
        return False
    classes = [_char_class(c) for c in stripped if c.isalnum()]
    switches = sum(a != b for a, b in zip(classes, classes[1:]))
    if switches / max(1, len(classes) - 1) < _MIN_CLASS_SWITCH_RATIO:
        return False
    in_long_runs = sum(n for n in (len(list(run)) for _, run in itertools.groupby(classes)) if n >= 4)
    return in_long_runs / len(classes) <= _MAX_LONG_RUN_FRACTION and _entropy_bits(stripped) >= _MIN_ENTROPY_BITS


@dataclass
class Redactor:
    """Applies the rules when `enabled`; counts replacements by kind, per file via `text(..., counts)`."""

    enabled: bool = True
    credential_paths: frozenset[str] = frozenset()
    totals: Counter = field(default_factory=Counter)

    def text(self, text: str, counts: Counter | None = None) -> str:
        if not self.enabled:
            return text
        local: Counter = Counter()

        def sub(pattern: re.Pattern, kind: str, replace, value: str) -> str:
            def counted(match: re.Match) -> str:
                replacement = replace(match)
                if replacement != match.group(0):
                    local[kind] += 1
                return replacement

            return pattern.sub(counted, value)

        text = sub(_PRIVATE_KEY, "private_key", lambda m: MARK, text)
        text = sub(_URL_CREDENTIALS, "url_credentials", lambda m: f"{m.group(1)}{MARK}@", text)
        text = sub(_BEARER, "bearer_token",
                   lambda m: m.group(0) if m.group(3) == MARK else f"{m.group(1)}{m.group(2)}{MARK}", text)
        text = sub(_ENV_ASSIGNMENT, "secret_variable",
                   lambda m: f"{m.group(1)}={MARK}" if is_secret_name(m.group(1)) and m.group(2) != MARK
                   else m.group(0), text)
        if _ANY_SECRET_KEY_WORD.search(text):
            text = sub(_KEY_VALUE, "secret_value", _key_value_replacement, text)
            text = sub(_FLAG_VALUE, "secret_value",
                       lambda m: m.group(0) if m.group(3) == MARK else f"{m.group(1)}{m.group(2)}{MARK}", text)
        text = sub(_SHORT_PASSWORD, "secret_value", lambda m: f"{m.group(1)}{m.group(2) or ''}{MARK}", text)
        text = sub(_USER_PASSWORD, "secret_value", lambda m: f"{m.group(1)}{m.group(2)}{m.group(3)}:{MARK}", text)
        text = sub(_KNOWN_TOKEN, "known_token", lambda m: MARK, text)
        text = sub(_ENTROPY_CANDIDATE, "high_entropy", lambda m: MARK if looks_random(m.group(0)) else m.group(0),
                   text)
        self.totals.update(local)
        if counts is not None:
            counts.update(local)
        return text

    def data(self, data: bytes, counts: Counter | None = None) -> bytes:
        """Bytes of any file: redacted as text, undecodable bytes kept exactly."""
        if not self.enabled:
            return data
        return self.text(data.decode("utf-8", "surrogateescape"), counts).encode("utf-8", "surrogateescape")

    def env_value(self, name: str, value: str, counts: Counter | None = None) -> str:
        """The value of one environment variable: all of it when the name suggests a secret."""
        if not self.enabled:
            return value
        if is_secret_name(name):
            self.totals["secret_variable"] += 1
            if counts is not None:
                counts["secret_variable"] += 1
            return MARK
        return self.text(value, counts)

    def is_credential_file(self, path: str | Path) -> bool:
        """Files never read, redaction or not: named by a credential variable, or credential stores."""
        try:
            real = os.path.realpath(path)
        except (OSError, ValueError):
            return True
        if any(real == p or real.startswith(p.rstrip("/") + "/") for p in self.credential_paths):
            return True
        parts = Path(real).parts
        return bool(_CREDENTIAL_FILE_NAMES.match(parts[-1] if parts else "")) or any(
            part in _CREDENTIAL_DIR_NAMES for part in parts[:-1])


def credential_paths(environ: Mapping[str, str]) -> frozenset[str]:
    """Real paths named by credential variables (and by secret-named variables that hold a path)."""
    found = set()
    for name, value in environ.items():
        if name not in CREDENTIAL_FILE_VARIABLES and not is_secret_name(name):
            continue
        for candidate in value.split(os.pathsep):
            if candidate.startswith(("/", "~", ".")) and len(candidate) < 4096:
                path = os.path.expanduser(candidate)
                try:
                    real = os.path.realpath(path)
                    # "/" or "/tmp" in a secret-named variable must not hide every file below it
                    if os.path.exists(path) and (os.path.isfile(real) or len(Path(real).parts) > 2):
                        found.add(real)
                except (OSError, ValueError):
                    continue
    return frozenset(found)


def make_redactor(enabled: bool, environ: Mapping[str, str] | None = None) -> Redactor:
    return Redactor(enabled=enabled, credential_paths=credential_paths(os.environ if environ is None else environ))
