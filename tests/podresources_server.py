"""An in-process kubelet pod-resources server (v1 PodResourcesLister.List) on a Unix socket."""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path

import grpc

from tpu_tools.metrics.kube.proto import podresources_pb2 as pb
from tpu_tools.metrics.kube.proto import podresources_pb2_grpc as pb_grpc


def pod(namespace: str, name: str, container: str, resource: str, device_ids: list[str]) -> pb.PodResources:
    return pb.PodResources(name=name, namespace=namespace, containers=[pb.ContainerResources(
        name=container, devices=[pb.ContainerDevices(resource_name=resource, device_ids=device_ids)])])


class Lister(pb_grpc.PodResourcesListerServicer):
    def __init__(self, pods: list[pb.PodResources]):
        self.pods = pods
        self.calls = 0
        self.hanging = threading.Event()
        self.released = threading.Event()

    def List(self, request, context):  # noqa: N802 (the API's name)
        self.calls += 1
        if self.hanging.is_set():
            self.released.wait(30)
        return pb.ListPodResourcesResponse(pod_resources=self.pods)


class PodResourcesServer:
    def __init__(self, path: Path, pods: list[pb.PodResources]):
        self.path = path
        self.lister = Lister(pods)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_PodResourcesListerServicer_to_server(self.lister, self._server)
        self._server.add_insecure_port(f"unix://{path}")

    def __enter__(self) -> PodResourcesServer:
        self._server.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.lister.released.set()
        self._server.stop(grace=None)
