"""GKE's multi-tier checkpointing (gemma-tpu:cluster.multiTierCheckpointing), as plain data that both the
component (infra.cloud.multi_tier) and the workload builders read: the CheckpointConfiguration of the
stack's TPU pool shape, the bucket its node replicator backs up to, and what a training pod needs.

Checked against the open-source CRD of GKE's HighScaleCheckpointing backend
(GoogleCloudPlatform/high-scale-checkpointing-controller, crd/checkpointconfiguration.yaml, in
../shared/schemas), not against a cluster's: tests/workloads validate the objects with it.
"""

from typing import Any

from infra.config import StackConfig
from infra.config.runs import local_tier_gib

API_VERSION = "checkpointing.gke.io/v1"
CSI_DRIVER = "multitier-checkpoint.csi.storage.gke.io"
# The node DaemonSet's Kubernetes account, which GKE creates; it reads and writes the backup bucket.
REPLICATOR_NAMESPACE = "gke-managed-checkpointing"
REPLICATOR_SERVICE_ACCOUNT = "gke-checkpointing-multitier-node"
# JAX's coordinator, on the pod the node's rank server makes process 0 (its jax-init-info.txt).
COORDINATOR_PORT = 8476
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
_TPU_TOLERATION = {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}


def backup_bucket(config: StackConfig) -> str:
    """The hierarchical-namespace bucket the replicator backs up to (gs://BUCKET/<JobSet name>/...)."""
    return f"{config.project}-{config.stack}-mtc"


def in_memory_volume_gib(config: StackConfig) -> int:
    """Each node's RAM disk: the largest local tier of the stack's runs (infra.config.runs.local_tier_gib)."""
    return max(local_tier_gib(run.training, config.slice) for run in config.runs if run.training.local_checkpoint_interval is not None)


def node_selector(config: StackConfig) -> dict[str, str]:
    """The nodes the CheckpointConfiguration's driver runs on, which the training pods select too."""
    return {INSTANCE_TYPE_LABEL: config.slice.machine_type}


def checkpoint_configurations(config: StackConfig) -> list[dict[str, Any]]:
    """One CheckpointConfiguration per TPU pool shape (the stack's pools share one); none without the switch.
    Cluster-scoped: no namespace."""
    if config.multi_tier is None:
        return []
    return [{
        "apiVersion": API_VERSION,
        "kind": "CheckpointConfiguration",
        "metadata": {"name": f"{config.cluster_name}-{config.slice.machine_type}"},
        "spec": {
            "cloudStorageBucketName": backup_bucket(config),  # the bare name, not gs://
            "nodeSelector": node_selector(config),
            "tolerations": [dict(_TPU_TOLERATION)],
            "inMemoryVolumeSize": f"{in_memory_volume_gib(config)}Gi",
        },
    }]


def replicator_principal(project_number: str, config: StackConfig) -> str:
    """The IAM principal of the node replicator's Kubernetes account (Workload Identity Federation for GKE)."""
    return (f"principal://iam.googleapis.com/projects/{project_number}/locations/global/workloadIdentityPools/"
            f"{config.workload_identity_pool}/subject/ns/{REPLICATOR_NAMESPACE}/sa/{REPLICATOR_SERVICE_ACCOUNT}")
