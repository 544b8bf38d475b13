"""A pod's own Kubernetes labels, read from the API server with the exporter's service account
(`tpu-monitor --pod-labels`; the RBAC is deploy/kubernetes/optional/pod-labels-rbac.yaml).

In-cluster configuration: the API server at $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, the token and
CA certificate of the service account mounted in the pod ($TPU_TOOLS_SERVICEACCOUNT_DIR, else the standard
folder). Each pod is read at most once a minute. What comes back is bounded: the answer's size, the number
of labels (the first MAX_LABELS by name), their names (as Prometheus label names, `label_` and the
sanitised key, as kube-state-metrics names them) and values (labeltext.label_value).
"""

from __future__ import annotations

import json
import os
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from tpu_tools.errors import RuntimeFailure
from tpu_tools.metrics.labeltext import label_value

SERVICEACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
ENV_SERVICEACCOUNT = "TPU_TOOLS_SERVICEACCOUNT_DIR"
MAX_ANSWER_BYTES = 4 << 20
MAX_LABELS = 32
MAX_NAME = 100
TTL_S = 60.0
RBAC = "deploy/kubernetes/optional/pod-labels-rbac.yaml"


def label_name(key: str) -> str:
    """A Kubernetes label key as a Prometheus label name: app.kubernetes.io/name -> label_app_kubernetes_io_name."""
    return ("label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key))[:MAX_NAME]


class PodLabelReader:
    def __init__(self, timeout_s: float, environ: Mapping[str, str] | None = None):
        env = os.environ if environ is None else environ
        self.timeout_s = timeout_s
        self.host, self.port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
        self.account = Path(env.get(ENV_SERVICEACCOUNT) or SERVICEACCOUNT)
        self._context: ssl.SSLContext | None = None
        self._cache: dict[tuple[str, str], tuple[float, dict[str, str]]] = {}

    def _ssl(self) -> ssl.SSLContext:
        if self._context is None:
            try:
                self._context = ssl.create_default_context(cafile=str(self.account / "ca.crt"))
            except (OSError, ssl.SSLError) as error:
                raise RuntimeFailure(f"cannot read the service account's CA certificate in {self.account}: "
                                     f"{error}") from error
        return self._context

    def labels(self, namespace: str, pod: str) -> dict[str, str]:
        """{label name: value} of the pod, from the cache when read less than a minute ago. Raises
        RuntimeFailure with the reason (not in a cluster, no token, refused by RBAC, no answer)."""
        now = time.monotonic()
        cached = self._cache.get((namespace, pod))
        if cached is not None and now - cached[0] < TTL_S:
            return cached[1]
        found = self._read(namespace, pod)
        self._cache = {key: value for key, value in self._cache.items() if now - value[0] < TTL_S}
        self._cache[(namespace, pod)] = (now, found)
        return found

    def _read(self, namespace: str, pod: str) -> dict[str, str]:
        if not self.host:
            raise RuntimeFailure("--pod-labels needs the Kubernetes API (KUBERNETES_SERVICE_HOST is not set)")
        try:
            token = (self.account / "token").read_text().strip()
        except OSError as error:
            raise RuntimeFailure(f"no service account token in {self.account} (automountServiceAccountToken: "
                                 f"true and the RBAC of {RBAC})") from error
        host = f"[{self.host}]" if ":" in self.host else self.host
        url = (f"https://{host}:{self.port}/api/v1/namespaces/{urllib.parse.quote(namespace, safe='')}/pods/"
               f"{urllib.parse.quote(pod, safe='')}")
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}",
                                                       "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self._ssl()) as answer:
                body = answer.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as error:
            why = " (the service account may not get pods: apply " + RBAC + ")" if error.code == 403 else ""
            raise RuntimeFailure(f"the Kubernetes API answered HTTP {error.code} for pod {namespace}/{pod}"
                                 f"{why}") from error
        except (OSError, ssl.SSLError) as error:  # URLError, a timeout, a refused connection, a bad certificate
            reason = getattr(error, "reason", error)
            raise RuntimeFailure(f"the Kubernetes API at {host}:{self.port} did not answer: {reason}") from error
        if len(body) > MAX_ANSWER_BYTES:
            raise RuntimeFailure(f"pod {namespace}/{pod}: the API's answer is larger than "
                                 f"{MAX_ANSWER_BYTES >> 20} MiB")
        try:
            labels = json.loads(body)["metadata"].get("labels") or {}
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
            raise RuntimeFailure(f"pod {namespace}/{pod}: the API's answer is not a pod") from error
        if not isinstance(labels, dict):
            raise RuntimeFailure(f"pod {namespace}/{pod}: the API's answer is not a pod")
        chosen = sorted((str(key), str(value)) for key, value in labels.items())[:MAX_LABELS]
        return {label_name(key): label_value(value) for key, value in chosen}
