"""GKE identity: Workload Identity on every cluster, and nodes that run as a dedicated service
account behind the GKE metadata server (so pods cannot read the node's credentials)."""

from collections.abc import Mapping
from typing import Any

from rules.base import ResourceRule, as_list, dig

CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
GKE_METADATA = "GKE_METADATA"
WORKLOAD_POOL_SUFFIX = ".svc.id.goog"
# The Compute Engine default service account (PROJECT_NUMBER-compute@...) is project Editor.
_DEFAULT_SA_SUFFIX = "-compute@developer.gserviceaccount.com"


def is_default_service_account(email: Any) -> bool:
    return not email or email == "default" or str(email).endswith(_DEFAULT_SA_SUFFIX)


def _node_config_problems(node_config: Any, where: str) -> list[str]:
    problems = []
    if is_default_service_account(dig(node_config, "serviceAccount")):
        problems.append(
            f"{where} runs as the default Compute Engine service account (project Editor); set "
            "nodeConfig.serviceAccount to a dedicated least-privilege service account"
        )
    if dig(node_config, "workloadMetadataConfig", "mode") != GKE_METADATA:
        problems.append(
            f"{where} must set nodeConfig.workloadMetadataConfig.mode: {GKE_METADATA} so pods get "
            "their Workload Identity, not the node's credentials"
        )
    return problems


def _auto_provisioning_problems(cluster: Mapping[str, Any], where: str) -> list[str]:
    email = dig(cluster, "clusterAutoscaling", "autoProvisioningDefaults", "serviceAccount")
    if not is_default_service_account(email):
        return []
    return [
        f"{where} auto-provisions nodes as the default Compute Engine service account; set "
        "clusterAutoscaling.autoProvisioningDefaults.serviceAccount to a dedicated one"
    ]


def check_node_identity(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    if resource_type == NODE_POOL:
        return _node_config_problems(props.get("nodeConfig"), "node pool")
    if resource_type != CLUSTER:
        return []
    if props.get("enableAutopilot") is True:
        return _auto_provisioning_problems(props, "Autopilot cluster")
    problems = []
    if props.get("removeDefaultNodePool") is not True:
        problems += _node_config_problems(props.get("nodeConfig"), "the cluster's default node pool")
    for index, pool in enumerate(as_list(props.get("nodePools"))):
        problems += _node_config_problems(dig(pool, "nodeConfig"), f"nodePools[{index}]")
    if dig(props, "clusterAutoscaling", "enabled") is True:
        problems += _auto_provisioning_problems(props, "node auto-provisioning")
    return problems


def check_cluster_workload_identity(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    if resource_type != CLUSTER or props.get("enableAutopilot") is True:
        return []  # Autopilot always runs Workload Identity
    pool = dig(props, "workloadIdentityConfig", "workloadPool")
    project = props.get("project")
    expected = f"{project}{WORKLOAD_POOL_SUFFIX}" if project else f"PROJECT{WORKLOAD_POOL_SUFFIX}"
    if not isinstance(pool, str) or not pool.endswith(WORKLOAD_POOL_SUFFIX):
        return [f"cluster must enable Workload Identity: set workloadIdentityConfig.workloadPool: {expected}"]
    if project and pool != expected:
        return [f"workloadIdentityConfig.workloadPool is {pool!r}; it must be {expected!r}, the cluster's own project"]
    return []


NODE_IDENTITY = ResourceRule(
    name="nodes-dedicated-sa-gke-metadata",
    description=(
        "Node pools (and auto-provisioned nodes) run as a non-default service account, "
        "with the GKE metadata server (workloadMetadataConfig.mode GKE_METADATA)."
    ),
    check=check_node_identity,
)
CLUSTER_WORKLOAD_IDENTITY = ResourceRule(
    name="clusters-workload-identity",
    description="GKE clusters have Workload Identity (workloadPool PROJECT.svc.id.goog; always on in Autopilot).",
    check=check_cluster_workload_identity,
)
