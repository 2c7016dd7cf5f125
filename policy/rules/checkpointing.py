"""GKE's multi-tier checkpointing: a pod that mounts its CSI volume is served. Without the cluster's addon,
or without a CheckpointConfiguration whose node selector the pod's nodes match (only those nodes run the
volume's driver), the pod waits in ContainerCreating for good; and GKE's rank server, which gives each pod its
process id, reads only a JobSet of exactly one replicated Job."""

from collections.abc import Sequence

from rules.base import Resource, StackRule, Violation, as_list, dig, is_mapping
from rules.kubernetes import kubernetes_objects, pod_specs

CSI_DRIVER = "multitier-checkpoint.csi.storage.gke.io"
CLUSTER = "gcp:container/cluster:Cluster"
CONFIGURATION_KIND = "CheckpointConfiguration"


def _mounts_the_volume(pod) -> bool:
    return any(dig(volume, "csi", "driver") == CSI_DRIVER for volume in as_list(pod.get("volumes")))


def check_multi_tier_volumes_served(resources: Sequence[Resource]) -> list[Violation]:
    objects = [(r, obj) for r in resources for obj in kubernetes_objects(r.type, r.props)]
    clusters = [r.props for r in resources if r.type == CLUSTER]
    addon = any(dig(c, "addonsConfig", "highScaleCheckpointingConfig", "enabled") is True and c.get("enableAutopilot") is not True
                for c in clusters)
    selectors = [dig(obj.body, "spec", "nodeSelector") or {} for _, obj in objects if obj.kind == CONFIGURATION_KIND]
    violations = []
    for resource, obj in objects:
        pods = [pod for pod in pod_specs(obj) if _mounts_the_volume(pod)]
        if not pods:
            continue
        if not addon:
            violations.append(Violation(
                f"{obj.label}: its pods mount the {CSI_DRIVER} volume, but no Standard cluster of the stack enables "
                "addonsConfig.highScaleCheckpointingConfig; enable it (gemma-tpu:cluster.multiTierCheckpointing)", resource))
        for pod in pods:
            chosen = pod.get("nodeSelector") if is_mapping(pod.get("nodeSelector")) else {}
            if not any(is_mapping(s) and s.items() <= chosen.items() for s in selectors):
                violations.append(Violation(
                    f"{obj.label}: its pods mount the {CSI_DRIVER} volume on nodes no {CONFIGURATION_KIND} selects "
                    f"(pods' nodeSelector {dict(chosen)}); only those nodes run the volume's driver", resource))
        if obj.kind == "JobSet" and len(as_list(dig(obj.body, "spec", "replicatedJobs"))) != 1:
            violations.append(Violation(
                f"{obj.label}: GKE's rank server reads a JobSet with exactly one replicated Job (replicas = slices, "
                "parallelism = hosts); merge them", resource))
    return violations


MULTI_TIER_VOLUMES_SERVED = StackRule(
    name="multi-tier-volumes-served",
    description=(
        f"A pod that mounts GKE's multi-tier checkpointing volume ({CSI_DRIVER}) runs on a cluster with the "
        f"HighScaleCheckpointing addon, on nodes a {CONFIGURATION_KIND} selects; a JobSet of such pods has one replicated Job."
    ),
    check=check_multi_tier_volumes_served,
)
