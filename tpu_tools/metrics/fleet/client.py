"""A small client of Prometheus's HTTP API (`/api/v1/query`): instant queries, one clear sentence per failure."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from tpu_tools.errors import RuntimeFailure, UsageError, first_line

_MAX_BODY = 64 * 1024 * 1024  # a fleet of thousands of chips is a few MB of JSON; more is not Prometheus


@dataclass(frozen=True)
class Sample:
    """One series of an instant vector: its labels (with `__name__`) and its value."""

    labels: dict[str, str]
    value: float

    @property
    def name(self) -> str:
        return self.labels.get("__name__", "")


@dataclass(frozen=True)
class Endpoint:
    """A Prometheus base URL without credentials, and the Authorization header they become."""

    base_url: str
    authorization: str | None

    @property
    def shown(self) -> str:
        return self.base_url


def parse_url(text: str) -> Endpoint:
    """'http://user:pass@host:9090/prefix' -> base URL and a basic-auth header. Raises UsageError."""
    parts = urllib.parse.urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--from-prometheus {text!r}: expected an http:// or https:// URL of a Prometheus server")
    try:
        port = parts.port
    except ValueError as error:
        raise UsageError(f"--from-prometheus {text!r}: {error}") from error
    authorization = None
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        authorization = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = host + (f":{port}" if port is not None else "")
    base = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    return Endpoint(base, authorization)


class PrometheusAPI:
    def __init__(self, endpoint: Endpoint, timeout_s: float):
        self.endpoint = endpoint
        self.timeout_s = timeout_s

    def query(self, expr: str) -> list[Sample]:
        """The instant vector of `expr` now. Raises RuntimeFailure with one sentence on any failure."""
        data = self._get("/api/v1/query", {"query": expr})
        result = data.get("result")
        if data.get("resultType") != "vector" or not isinstance(result, list):
            raise RuntimeFailure(f"Prometheus at {self.endpoint.shown} answered {expr!r} with no instant vector")
        samples = []
        for item in result:
            try:
                labels = {str(k): str(v) for k, v in item["metric"].items()}
                samples.append(Sample(labels, float(item["value"][1])))
            except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
                raise RuntimeFailure(f"Prometheus at {self.endpoint.shown} answered a malformed sample") from error
        return samples

    def _get(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        where = self.endpoint.shown
        url = self.endpoint.base_url + path + "?" + urllib.parse.urlencode(params)
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        if self.endpoint.authorization:
            request.add_header("Authorization", self.endpoint.authorization)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = response.read(_MAX_BODY + 1)
        except urllib.error.HTTPError as error:
            if error.code in (401, 403):
                hint = "" if self.endpoint.authorization else ": give user:password@ in the URL"
                raise RuntimeFailure(f"Prometheus at {where} refused the query (HTTP {error.code}, "
                                     f"authentication needed{hint})") from error
            body = error.read(_MAX_BODY)
            try:
                message = str(json.loads(body).get("error") or "")
            except (ValueError, AttributeError):
                message = ""
            raise RuntimeFailure(f"Prometheus at {where} answered HTTP {error.code}"
                                 + (f": {first_line(ValueError(message), limit=200)}" if message else "")) from error
        except TimeoutError as error:
            raise RuntimeFailure(f"Prometheus at {where} did not answer within {self.timeout_s:g} s") from error
        except urllib.error.URLError as error:
            reason = error.reason
            if isinstance(reason, TimeoutError):
                raise RuntimeFailure(f"Prometheus at {where} did not answer within {self.timeout_s:g} s") from error
            if isinstance(reason, ConnectionRefusedError):
                raise RuntimeFailure(f"cannot reach Prometheus at {where}: connection refused") from error
            text = reason.strerror if isinstance(reason, OSError) and reason.strerror else str(reason)
            raise RuntimeFailure(f"cannot reach Prometheus at {where}: {first_line(ValueError(text))}") from error
        except (OSError, ValueError) as error:  # reset connections, broken HTTP, bad TLS
            raise RuntimeFailure(f"cannot read from Prometheus at {where}: {first_line(error)}") from error
        if len(body) > _MAX_BODY:
            raise RuntimeFailure(f"Prometheus at {where} answered more than {_MAX_BODY >> 20} MiB")
        try:
            document = json.loads(body)
        except (ValueError, UnicodeDecodeError) as error:
            raise RuntimeFailure(f"Prometheus at {where} did not answer with its HTTP API (not JSON)") from error
        if not isinstance(document, dict) or document.get("status") not in ("success", "error"):
            raise RuntimeFailure(f"Prometheus at {where} did not answer with its HTTP API (no status)")
        if document["status"] == "error":
            raise RuntimeFailure(f"Prometheus at {where} rejected the query: {document.get('error') or 'no reason'}")
        data = document.get("data")
        if not isinstance(data, dict):
            raise RuntimeFailure(f"Prometheus at {where} did not answer with its HTTP API (no data)")
        return data
