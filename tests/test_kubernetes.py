"""deploy/kubernetes: the exporter's DaemonSet and friends, rendered per overlay and validated offline
against the API schema of a pinned Kubernetes version."""

from __future__ import annotations

import click
import kubernetes_validate
import pytest
from conftest import REPO
from kustomize import render

KUBERNETES_VERSION = "1.31.0"  # the schema the manifests are checked against (GKE and EKS support it)
OVERLAYS = REPO / "deploy" / "kubernetes" / "overlays"


def _by_kind(resources):
    return {r["kind"]: r for r in resources}


@pytest.fixture(params=["tpu", "gpu"])
def overlay(request):
    return request.param, render(OVERLAYS / request.param)


def test_every_built_in_resource_is_valid_for_the_pinned_version(overlay):
    _, resources = overlay
    kinds = sorted(r["kind"] for r in resources)
    assert kinds == ["DaemonSet", "Namespace", "PodMonitor", "Service", "ServiceAccount"]
    for resource in resources:
        if resource["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a custom resource of the Prometheus Operator: checked below
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
        assert resource["metadata"]["labels"]["app.kubernetes.io/part-of"] == "tpu-tools"
        if resource["kind"] != "Namespace":
            assert resource["metadata"]["namespace"] == "tpu-tools"


def test_a_broken_manifest_is_caught_by_the_validator(overlay):
    _, resources = overlay
    daemonset = _by_kind(resources)["DaemonSet"]
    daemonset["spec"]["template"]["spec"]["hostPID"] = "yes"
    with pytest.raises(kubernetes_validate.ValidationError, match="'yes' is not of type 'boolean'"):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSION, strict=True)


def test_the_exporter_sees_the_node_and_little_else(overlay):
    name, resources = overlay
    daemonset = _by_kind(resources)["DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1000
    (exporter,) = pod["containers"]
    assert exporter["image"] == "ghcr.io/tpu-tools/tpu-tools:0.1.0"
    assert exporter["securityContext"]["readOnlyRootFilesystem"] is True
    assert exporter["securityContext"]["allowPrivilegeEscalation"] is False
    assert exporter["resources"]["limits"]
    assert exporter["resources"]["requests"]
    mounts = {m["mountPath"]: m for m in exporter["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for path in ("/host/sys", "/host/dev", "/host/proc"):
        assert mounts[path]["readOnly"] is True
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == path.removeprefix("/host")
    agents = mounts["/run/tpu-tools"]
    assert volumes[agents["name"]]["hostPath"] == {"path": "/run/tpu-tools", "type": "DirectoryOrCreate"}
    assert mounts["/var/lib/kubelet/pod-resources"]["readOnly"] is True  # pod labels
    assert volumes[mounts["/var/lib/kubelet/pod-resources"]["name"]]["hostPath"]["path"] == \
        "/var/lib/kubelet/pod-resources"
    env = {e["name"]: e["value"] for e in exporter["env"]}
    assert env["TPU_TOOLS_SYSROOT"] == "/host"
    assert env["TPU_TOOLS_RUNTIME_DIR"] == "/run/tpu-tools"
    tolerations = {t["key"] for t in pod["tolerations"]}
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {e["key"] for term in terms for e in term["matchExpressions"]}
    if name == "tpu":
        assert tolerations == {"google.com/tpu"}
        assert keys == {"cloud.google.com/gke-tpu-accelerator"}
        assert pod["hostNetwork"] is True  # libtpu's metrics service listens on the workload's localhost
    else:
        assert tolerations == {"nvidia.com/gpu"}
        assert keys == {"nvidia.com/gpu.present"}
        assert "hostNetwork" not in pod


def test_the_exporter_command_line_is_one_tpu_monitor_accepts(overlay):
    from tpu_tools.cli.monitor import monitor_command

    _, resources = overlay
    (exporter,) = _by_kind(resources)["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    context = monitor_command.make_context("tpu-monitor", list(exporter["args"]))
    assert context.params["prometheus_address"] == "0.0.0.0:9400"
    assert context.params["quiet"] is True
    port = exporter["ports"][0]
    assert port == {"name": "metrics", "containerPort": 9400, "protocol": "TCP"}
    with pytest.raises(click.UsageError, match="No such option '--prometheus-port'"):
        monitor_command.make_context("tpu-monitor", ["--prometheus-port", "9400"])


def test_service_and_pod_monitor_select_the_exporter_pods(overlay):
    _, resources = overlay
    kinds = _by_kind(resources)
    pod_labels = kinds["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    assert kinds["DaemonSet"]["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert kinds["Service"]["spec"]["selector"].items() <= pod_labels.items()
    monitor = kinds["PodMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics"
    assert endpoint["relabelings"] == [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "instance"}]


def test_the_optional_service_monitor_selects_the_service_and_its_port(overlay):
    import yaml

    _, resources = overlay
    service = _by_kind(resources)["Service"]
    monitor = yaml.safe_load((REPO / "deploy" / "kubernetes" / "optional" / "servicemonitor.yaml").read_text())
    assert monitor["kind"] == "ServiceMonitor"
    assert monitor["metadata"]["namespace"] == "tpu-tools"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
