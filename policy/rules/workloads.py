"""Workload pods: no host access unless the object opts in to the network-tuning mode, and images
only from the stack's own Artifact Registry repository."""

from collections.abc import Mapping, Sequence
from typing import Any

from rules.base import Resource, ResourceRule, StackRule, Violation, as_list, dig
from rules.kubernetes import KubeObject, containers, kubernetes_objects, pod_specs

# The opt-in: an annotation on the Job / JobSet / Pod object itself (docs/policy.md). The one mode,
# "host-network", lets its pods use the host network, privileged containers (to raise network
# sysctls) and hostPath volumes. hostPID and hostIPC are never allowed.
NETWORK_TUNING_ANNOTATION = "gemma-tpu/network-tuning"
NETWORK_TUNING_MODES = ("host-network",)
# The training workloads; controllers (Deployments such as JobSet's) come from upstream registries.
WORKLOAD_KINDS = ("Pod", "Job", "CronJob", "JobSet")
REPOSITORY = "gcp:artifactregistry/repository:Repository"
GCP_PROVIDER = "pulumi:providers:gcp"
# A pushed build's reference is unknown until `pulumi up`; its tags, which say where it goes, are not.
IMAGE_BUILD = "docker-build:index:Image"


def _network_tuning(obj: KubeObject) -> tuple[bool, list[str]]:
    """(opted in, problems with the annotation)."""
    mode = obj.annotation(NETWORK_TUNING_ANNOTATION)
    if mode is None:
        return False, []
    if mode in NETWORK_TUNING_MODES:
        return True, []
    return False, [
        f"{obj.label}: annotation {NETWORK_TUNING_ANNOTATION}={mode!r} is not a known mode; "
        f"use one of {', '.join(NETWORK_TUNING_MODES)} or remove it"
    ]


def _host_access(obj: KubeObject, pod: Mapping[str, Any], opted_in: bool) -> list[str]:
    fix = f"remove it, or opt the object in with the annotation {NETWORK_TUNING_ANNOTATION}: {NETWORK_TUNING_MODES[0]}"
    problems = [
        f"{obj.label}: pods set {field}: true, which is never allowed; remove it"
        for field in ("hostPID", "hostIPC")
        if pod.get(field) is True
    ]
    if opted_in:
        return problems
    if pod.get("hostNetwork") is True:
        problems.append(f"{obj.label}: pods set hostNetwork: true; {fix}")
    problems += [
        f"{obj.label}: container {c.get('name')!r} is privileged; {fix}"
        for c in containers(pod)
        if dig(c, "securityContext", "privileged") is True
    ]
    problems += [
        f"{obj.label}: volume {v.get('name')!r} mounts hostPath {dig(v, 'hostPath', 'path')!r}; {fix}"
        for v in as_list(pod.get("volumes"))
        if dig(v, "hostPath") is not None
    ]
    return problems


def check_pods_unprivileged(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    problems = []
    for obj in kubernetes_objects(resource_type, props):
        opted_in, annotation_problems = _network_tuning(obj)
        problems += annotation_problems
        for pod in pod_specs(obj):
            problems += _host_access(obj, pod, opted_in)
    return problems


def registry_prefixes(resources: Sequence[Resource]) -> list[str]:
    """ "LOCATION-docker.pkg.dev/PROJECT/REPOSITORY/" of each Docker repository in the stack. A
    repository without its own `project` input lives in its provider's project; the graph does not
    say which gcp provider that is, so each one the stack declares is taken."""
    provider_projects = [r.props.get("project") for r in resources if r.type == GCP_PROVIDER]
    prefixes = []
    for repo in (r.props for r in resources if r.type == REPOSITORY):
        if str(repo.get("format", "")).upper() != "DOCKER":
            continue
        location, repository = repo.get("location"), repo.get("repositoryId")
        projects = [repo["project"]] if repo.get("project") else provider_projects
        prefixes += [f"{location}-docker.pkg.dev/{p}/{repository}/" for p in projects if p and location and repository]
    return prefixes


def _images(resource: Resource) -> list[tuple[str, Any]]:
    """(what, image reference) for each image a resource runs or pushes."""
    if resource.type == IMAGE_BUILD:
        if resource.props.get("push") is not True:
            return []
        return [("image build pushes tag", tag) for tag in as_list(resource.props.get("tags"))]
    return [
        (f"{obj.label}: container {c.get('name')!r} runs image", c.get("image"))
        for obj in kubernetes_objects(resource.type, resource.props)
        if obj.kind in WORKLOAD_KINDS
        for pod in pod_specs(obj)
        for c in containers(pod)
    ]


def check_images_from_stack_registry(resources: Sequence[Resource]) -> list[Violation]:
    prefixes = registry_prefixes(resources)
    where = " or ".join(prefixes) if prefixes else "(none: the stack declares no Docker repository)"
    return [
        Violation(
            f"{what} {image!r}, which is not in the stack's Artifact Registry repository {where}; "
            "push it there and use that URI",
            resource,
        )
        for resource in resources
        for what, image in _images(resource)
        if not any(str(image).startswith(p) for p in prefixes)
    ]


PODS_UNPRIVILEGED = ResourceRule(
    name="workload-pods-unprivileged",
    description=(
        "Pods are not privileged, mount no hostPath and use no host network, PID or IPC namespace, "
        f"unless the object opts in with the annotation {NETWORK_TUNING_ANNOTATION}: {NETWORK_TUNING_MODES[0]}."
    ),
    check=check_pods_unprivileged,
)
IMAGES_FROM_STACK_REGISTRY = StackRule(
    name="workload-images-from-stack-registry",
    description=(
        "Every container of a Pod, Job, CronJob or JobSet runs an image from an Artifact Registry "
        "repository of the same stack (LOCATION-docker.pkg.dev/PROJECT/REPOSITORY/...), and every "
        "image the stack builds is pushed there."
    ),
    check=check_images_from_stack_registry,
)
