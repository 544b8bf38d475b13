"""--pod-labels: a pod's own Kubernetes labels from an in-process API server over TLS, on the holder's series."""

from __future__ import annotations

import http.server
import json
import shutil
import ssl
import threading

import pytest
import yaml
from conftest import REPO, as_report
from test_exporter_webconfig import certificate

from tpu_tools.errors import RuntimeFailure
from tpu_tools.exporter.holders import device_holders
from tpu_tools.metrics.kube.api import MAX_LABELS, PodLabelReader, label_name
from tpu_tools.metrics.labeltext import MAX_LABEL_VALUE

TOKEN = "sa-token-123"


class FakeApiServer:
    """GET /api/v1/namespaces/NS/pods/NAME with the bearer token; pods: {(ns, name): labels}."""

    def __init__(self, directory, pods: dict, status: int = 200):
        cert, key = certificate(directory, "api")
        self.account = directory / "serviceaccount"
        self.account.mkdir()
        shutil.copy(cert, self.account / "ca.crt")
        (self.account / "token").write_text(TOKEN + "\n")
        self.requests: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                outer.requests.append(self.path)
                parts = self.path.split("/")
                labels = pods.get((parts[4], parts[6])) if len(parts) == 7 else None
                ok = self.headers.get("Authorization") == f"Bearer {TOKEN}" and labels is not None
                code = status if ok else 404
                body = json.dumps({"kind": "Pod", "metadata": {"name": parts[-1], "labels": labels}}).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def environ(self) -> dict[str, str]:
        return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.server.server_address[1]),
                "TPU_TOOLS_SERVICEACCOUNT_DIR": str(self.account)}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api(tmp_path):
    many = {f"k{i:05d}": "v" for i in range(10_000)}
    server = FakeApiServer(tmp_path, {("ml", "train-0"): {"team": "vision", "app.kubernetes.io/name": "trainer"},
                                      ("ml", "hostile"): {**many, "x": "\x1b[31m" + "y" * 10_000}})
    yield server
    server.close()


def test_labels_are_read_over_tls_with_the_token_and_cached(api):
    reader = PodLabelReader(5.0, api.environ())
    assert reader.labels("ml", "train-0") == {"label_team": "vision", "label_app_kubernetes_io_name": "trainer"}
    reader.labels("ml", "train-0")
    assert api.requests == ["/api/v1/namespaces/ml/pods/train-0"]  # once a minute per pod


def test_a_pod_with_ten_thousand_labels_is_bounded(api):
    labels = PodLabelReader(5.0, api.environ()).labels("ml", "hostile")
    assert len(labels) == MAX_LABELS
    assert all(len(v) <= MAX_LABEL_VALUE for v in labels.values())
    assert all("\x1b" not in v for v in labels.values())


def test_failures_are_one_sentence(api, tmp_path):
    with pytest.raises(RuntimeFailure, match="HTTP 404 for pod ml/gone"):
        PodLabelReader(5.0, api.environ()).labels("ml", "gone")
    with pytest.raises(RuntimeFailure, match="KUBERNETES_SERVICE_HOST is not set"):
        PodLabelReader(5.0, {}).labels("ml", "train-0")
    with pytest.raises(RuntimeFailure, match="no service account token"):
        PodLabelReader(5.0, {**api.environ(), "TPU_TOOLS_SERVICEACCOUNT_DIR": str(tmp_path / "none")}).labels("a", "b")


def test_a_refusal_names_the_rbac(tmp_path):
    server = FakeApiServer(tmp_path, {("ml", "p"): {"a": "b"}}, status=403)
    try:
        with pytest.raises(RuntimeFailure, match="may not get pods: apply deploy/kubernetes/optional/pod-labels"):
            PodLabelReader(5.0, server.environ()).labels("ml", "p")
    finally:
        server.close()


def test_the_holder_series_get_the_pod_labels():
    report = {"devices": {"devices": [{"key": "tpu:0", "holders": [{"pid": 5}], "processes": []}]},
              "processes": {"agents": [], "holders": [{"pid": 5, "kubernetes": {
                  "namespace": "ml", "pod": "train-0", "container": "c", "labels": {"label_team": "vision",
                                                                                   "label_pod": "not-the-pod"}}}]}}
    assert device_holders(as_report(report))["tpu:0"] == {"namespace": "ml", "pod": "train-0", "container": "c",
                                               "label_team": "vision", "label_pod": "not-the-pod"}
    assert label_name("app.kubernetes.io/name") == "label_app_kubernetes_io_name"


def test_the_rbac_may_only_get_pods_for_the_exporters_service_account():
    import kubernetes_validate
    from test_kubernetes import KUBERNETES_VERSION

    documents = list(yaml.safe_load_all((REPO / "deploy/kubernetes/optional/pod-labels-rbac.yaml").read_text()))
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    role, binding = documents
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tpu-tools-exporter", "namespace": "tpu-tools"}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_monitor_pod_labels_end_to_end(api, tmp_path):
    from agentjobs import agent_env, running_job
    from conftest import run_tool
    from podresources_server import PodResourcesServer, pod
    from test_pod_labels import _host, _sock

    path = _sock(tmp_path)
    with running_job(light=True, tag="train") as (job, rundir), \
            PodResourcesServer(path, [pod("ml", "train-0", "trainer", "google.com/tpu", ["0", "1", "2", "3"])]):
        root = _host(tmp_path, job.pid)
        env = agent_env(rundir, TPU_TOOLS_SYSROOT=str(root), TPU_TOOLS_POD_RESOURCES_SOCKET=str(path), **api.environ())
        result = run_tool("tpu-monitor", "--count", "1", "--pod-labels", env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    (agent,) = report["processes"]["agents"]
    assert agent["kubernetes"]["labels"] == {"label_team": "vision", "label_app_kubernetes_io_name": "trainer"}
    assert device_holders(as_report(report))["tpu:0"]["label_team"] == "vision"
