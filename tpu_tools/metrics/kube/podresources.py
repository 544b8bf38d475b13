"""A client of the kubelet's pod-resources gRPC API: which container of which pod holds each device."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpu_tools.errors import RuntimeFailure

if TYPE_CHECKING:
    import grpc

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
ENV_SOCKET = "TPU_TOOLS_POD_RESOURCES_SOCKET"


@dataclass(frozen=True)
class ContainerRef:
    namespace: str
    pod: str
    container: str


def socket_path() -> Path:
    return Path(os.environ.get(ENV_SOCKET) or DEFAULT_SOCKET)


class PodResourcesClient:
    """One channel for the whole run; each List within `timeout_s`."""

    def __init__(self, path: Path, timeout_s: float):
        self.path = path
        self.timeout_s = timeout_s
        self._channel: grpc.Channel | None = None

    def device_owners(self) -> dict[tuple[str, str], ContainerRef]:
        """{(resource name, device id): container}. Raises RuntimeFailure with the reason."""
        if not self.path.exists():
            raise RuntimeFailure(f"no kubelet pod-resources socket at {self.path}")
        # gRPC and the generated modules are loaded only where a kubelet serves the API: outside Kubernetes
        # every start of tpu-monitor and tpu-top would pay for them (about 45 ms) for nothing.
        import grpc

        from tpu_tools.metrics.kube.proto import podresources_pb2 as pb
        from tpu_tools.metrics.kube.proto import podresources_pb2_grpc as pb_grpc

        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix://{self.path}")
        stub = pb_grpc.PodResourcesListerStub(self._channel)
        try:
            answer = stub.List(pb.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as error:
            code = error.code() if isinstance(error, grpc.Call) else None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise RuntimeFailure(f"the kubelet pod-resources API at {self.path} did not answer within "
                                     f"{self.timeout_s:g} s") from error
            detail = error.details() if isinstance(error, grpc.Call) else None
            raise RuntimeFailure(f"the kubelet pod-resources API at {self.path} failed: "
                                 f"{detail or code or error}") from error
        owners = {}
        for pod in answer.pod_resources:
            for container in pod.containers:
                for devices in container.devices:
                    for device_id in devices.device_ids:
                        owners[(devices.resource_name, device_id)] = ContainerRef(pod.namespace, pod.name,
                                                                                  container.name)
        return owners

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
