"""Render a kustomization the way `kubectl kustomize` does, for the subset deploy/kubernetes uses.

resources (files and directories), namespace, labels (metadata only), images, and patches given as
strategic-merge files with a target. Mappings merge; a list in a patch may only set a list the base does
not have (kustomize would merge lists by key, which this renderer does not do, so it refuses).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass"}
KNOWN_FIELDS = {"apiVersion", "kind", "resources", "namespace", "labels", "images", "patches"}


def _merge(base: Any, patch: Any, where: str) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = _merge(base[key], value, f"{where}.{key}") if key in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) or isinstance(patch, list):
        raise ValueError(f"{where}: a patch that changes an existing list needs kustomize's list merge")
    return copy.deepcopy(patch)


def _containers(resource: dict[str, Any]) -> list[dict[str, Any]]:
    spec = resource.get("spec", {}).get("template", {}).get("spec", {})
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def render(directory: Path) -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - KNOWN_FIELDS
    if unknown:
        raise ValueError(f"{directory}: fields this renderer does not implement: {sorted(unknown)}")
    resources: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        if path.is_dir():
            resources += render(path)
        else:
            resources += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for patch in kustomization.get("patches", []):
        body = yaml.safe_load((directory / patch["path"]).read_text())
        target = patch["target"]
        matches = [r for r in resources if r["kind"] == target["kind"] and r["metadata"]["name"] == target["name"]]
        if len(matches) != 1:
            raise ValueError(f"patch {patch['path']}: {len(matches)} resources match {target}")
        index = resources.index(matches[0])
        patch_body = {k: v for k, v in body.items() if k not in ("apiVersion", "kind", "metadata")}
        resources[index] = _merge(matches[0], patch_body, patch["path"])
    for resource in resources:
        if "namespace" in kustomization and resource["kind"] not in CLUSTER_SCOPED:
            resource["metadata"]["namespace"] = kustomization["namespace"]
        for group in kustomization.get("labels", []):
            resource["metadata"].setdefault("labels", {}).update(group["pairs"])
        for image in kustomization.get("images", []):
            for container in _containers(resource):
                if container["image"] == image["name"]:
                    container["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    return resources
