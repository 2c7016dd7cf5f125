"""Queued stacks (Kueue): no training workload bypasses the queue, and the queue promises no more
TPU chips than the stack's pools hold."""

import re
from collections.abc import Mapping, Sequence

from rules.base import Resource, StackRule, Violation, as_list, dig
from rules.kubernetes import KubeObject, containers, kubernetes_objects, pod_specs

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP = "kueue.x-k8s.io/"
TPU_RESOURCE = "google.com/tpu"
NODE_POOL = "gcp:container/nodePool:NodePool"
CLUSTER = "gcp:container/cluster:Cluster"
QUEUED_KINDS = ("Job", "JobSet")
# A TPU machine type ends in its chips per host: ct6e-standard-4t, ct5p-hightpu-4t.
_TPU_MACHINE = re.compile(r"^ct[0-9a-z]+-[a-z]+-(\d+)t$")


def _objects(resources: Sequence[Resource]) -> list[tuple[Resource, KubeObject]]:
    return [(r, obj) for r in resources for obj in kubernetes_objects(r.type, r.props)]


def _kueue(objects, kind: str) -> list[tuple[Resource, KubeObject]]:
    """The Kueue objects of `kind` among `objects`, each with the resource that applies it."""
    return [(r, obj) for r, obj in objects if obj.kind == kind and str(obj.body.get("apiVersion", "")).startswith(KUEUE_GROUP)]


def _requests_tpus(obj: KubeObject) -> bool:
    return any(
        TPU_RESOURCE in (dig(c, "resources", "requests") or {}) or TPU_RESOURCE in (dig(c, "resources", "limits") or {})
        for pod in pod_specs(obj)
        for c in containers(pod)
    )


def check_workloads_queued(resources: Sequence[Resource]) -> list[Violation]:
    """In a stack with a LocalQueue, each Job / JobSet whose pods ask for TPUs names a LocalQueue
    of its namespace; Kueue would leave an unlabelled one alone, outside the quota."""
    objects = _objects(resources)
    local_queues = {(dig(q.body, "metadata", "namespace"), dig(q.body, "metadata", "name")) for _, q in _kueue(objects, "LocalQueue")}
    if not local_queues:
        return []
    known = ", ".join(sorted(f"{ns}/{name}" for ns, name in local_queues))
    violations = []
    for resource, obj in objects:
        if obj.kind not in QUEUED_KINDS or not _requests_tpus(obj):
            continue
        queue = dig(obj.body, "metadata", "labels", QUEUE_LABEL)
        if (dig(obj.body, "metadata", "namespace"), queue) not in local_queues:
            violations.append(Violation(
                f"{obj.label} asks for TPUs but its label {QUEUE_LABEL} is {queue!r}, not a LocalQueue of its "
                f"namespace ({known}); label it with its queue so that Kueue admits it within the quota",
                resource,
            ))  # fmt: skip
    return violations


def _pool_chips(resources: Sequence[Resource]) -> int | None:
    """TPU chips of the stack's node pools at their largest; None when GKE makes the nodes (Autopilot)."""
    if any(r.type == CLUSTER and dig(r.props, "enableAutopilot") is True for r in resources):
        return None
    chips = 0
    for pool in (r for r in resources if r.type == NODE_POOL):
        match = _TPU_MACHINE.match(str(dig(pool.props, "nodeConfig", "machineType") or ""))
        if match:
            hosts = dig(pool.props, "autoscaling", "totalMaxNodeCount") or dig(pool.props, "nodeCount") or 0
            chips += int(match.group(1)) * int(hosts)
    return chips


def _tpu_quota(cluster_queue: KubeObject) -> int:
    return sum(
        int(resource.get("nominalQuota", 0))
        for group in as_list(dig(cluster_queue.body, "spec", "resourceGroups"))
        for flavor in as_list(dig(group, "flavors"))
        for resource in as_list(dig(flavor, "resources"))
        if isinstance(resource, Mapping) and resource.get("name") == TPU_RESOURCE
    )


def check_quota_within_capacity(resources: Sequence[Resource]) -> list[Violation]:
    capacity = _pool_chips(resources)
    if capacity is None:
        return []
    violations = []
    for resource, obj in _kueue(_objects(resources), "ClusterQueue"):
        quota = _tpu_quota(obj)
        if quota > capacity:
            violations.append(Violation(
                f"{obj.label} admits {quota} {TPU_RESOURCE} chips but the stack's TPU node pools hold {capacity}; "
                "admitted runs would wait for nodes that never come: lower the quota (gemma-tpu:queue.tpuQuota) or add pools",
                resource,
            ))  # fmt: skip
    return violations


WORKLOADS_QUEUED = StackRule(
    name="queued-workloads-carry-the-queue",
    description=(
        f"In a stack with a Kueue LocalQueue, every Job or JobSet whose pods request {TPU_RESOURCE} carries the label "
        f"{QUEUE_LABEL} naming a LocalQueue of its namespace: none bypasses the quota."
    ),
    check=check_workloads_queued,
)
QUOTA_WITHIN_CAPACITY = StackRule(
    name="queue-quota-within-capacity",
    description=f"A ClusterQueue's {TPU_RESOURCE} quota is at most the chips the stack's TPU node pools hold at their largest.",
    check=check_quota_within_capacity,
)
