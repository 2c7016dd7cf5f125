"""Serving workloads (gemma-tpu:serving, docs/serving.md): model servers run a digest-pinned image of
the stack's own registry, read their model through read-only bucket mounts, and are reached inside
the cluster unless a Service says, by annotation, that it is public and to whom.

A Deployment or StatefulSet this program declares is a model server: the controllers it installs
(JobSet, Kueue) come inside manifests and charts, whose objects these rules do not see.
"""

import ipaddress
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rules.base import Resource, ResourceRule, StackRule, Violation, as_list, dig
from rules.kubernetes import KubeObject, containers, kubernetes_objects, pod_specs
from rules.workloads import registry_prefixes

SERVER_KINDS = ("Deployment", "StatefulSet")
PUBLIC_ANNOTATION = "gemma-tpu/public-endpoint"  # "true" on a Service meant to be reached from outside
PUBLIC_TYPES = ("LoadBalancer", "NodePort")
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
_FUSE_DRIVER = "gcsfuse.csi.storage.gke.io"


def _servers(resource_type: str, props: Mapping[str, Any]) -> list[KubeObject]:
    return [obj for obj in kubernetes_objects(resource_type, props) if obj.kind in SERVER_KINDS]


def check_server_images_pinned(resources: Sequence[Resource]) -> list[Violation]:
    prefixes = registry_prefixes(resources)
    where = " or ".join(prefixes) if prefixes else "(none: the stack declares no Docker repository)"
    violations = []
    for resource in resources:
        for obj in _servers(resource.type, resource.props):
            for pod in pod_specs(obj):
                for container in containers(pod):
                    image = str(container.get("image"))
                    what = f"{obj.label}: container {container.get('name')!r} runs image {image!r}"
                    if not _DIGEST.search(image):
                        violations.append(Violation(
                            f"{what}, not pinned by digest: a tag can move under a running server; "
                            "give it as IMAGE@sha256:DIGEST", resource))  # fmt: skip
                    if not any(image.startswith(prefix) for prefix in prefixes):
                        violations.append(Violation(f"{what}, which is not in the stack's Artifact Registry {where}", resource))
    return violations


def check_model_mounts_read_only(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    problems = []
    for obj in _servers(resource_type, props):
        for pod in pod_specs(obj):
            buckets = {v.get("name") for v in as_list(pod.get("volumes")) if dig(v, "csi", "driver") == _FUSE_DRIVER}
            problems += [f"{obj.label}: bucket volume {v.get('name')!r} is not readOnly; a server only reads its model"
                         for v in as_list(pod.get("volumes")) if v.get("name") in buckets and dig(v, "csi", "readOnly") is not True]  # fmt: skip
            problems += [
                f"{obj.label}: container {c.get('name')!r} mounts bucket volume {m.get('name')!r} without readOnly"
                for c in containers(pod)
                for m in as_list(c.get("volumeMounts"))
                if m.get("name") in buckets and m.get("readOnly") is not True
            ]
    return problems


def _open_to_all(cidr: Any) -> bool:
    try:
        return ipaddress.ip_network(str(cidr), strict=False).prefixlen == 0
    except ValueError:
        return False


def check_services_not_public(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    problems = []
    for obj in kubernetes_objects(resource_type, props):
        if obj.kind != "Service":
            continue
        spec = obj.body.get("spec") or {}
        public = spec.get("type") in PUBLIC_TYPES or as_list(spec.get("externalIPs"))
        if not public:
            continue
        ranges = as_list(spec.get("loadBalancerSourceRanges"))
        if obj.annotation(PUBLIC_ANNOTATION) != "true":
            problems.append(
                f"{obj.label}: type {spec.get('type')} reaches the server from outside the cluster; keep it ClusterIP "
                f"(kubectl port-forward), or annotate it {PUBLIC_ANNOTATION}: \"true\" with loadBalancerSourceRanges"
            )
        elif not ranges or any(_open_to_all(cidr) for cidr in ranges):
            problems.append(f"{obj.label}: a public Service lists the client ranges in loadBalancerSourceRanges, none of them 0.0.0.0/0")
    return problems


SERVER_IMAGES_PINNED = StackRule(
    name="serving-images-pinned",
    description=(
        "Every container of a Deployment or StatefulSet runs an image pinned by digest (IMAGE@sha256:...) "
        "from an Artifact Registry repository of the same stack."
    ),
    check=check_server_images_pinned,
)
MODEL_MOUNTS_READ_ONLY = ResourceRule(
    name="serving-bucket-mounts-read-only",
    description="A Deployment's or StatefulSet's GCS FUSE volumes, and every mount of them, are read-only.",
    check=check_model_mounts_read_only,
)
SERVICES_NOT_PUBLIC = ResourceRule(
    name="serving-services-not-public",
    description=(
        f"A Service is ClusterIP unless annotated {PUBLIC_ANNOTATION}: \"true\"; a public one (LoadBalancer, "
        "NodePort, externalIPs) lists its clients in loadBalancerSourceRanges, none of them 0.0.0.0/0."
    ),
    check=check_services_not_public,
)
