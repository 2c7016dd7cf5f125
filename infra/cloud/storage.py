"""The data bucket (training corpus, read-only to training), the artifacts bucket (checkpoints,
TensorBoard logs, profiles) and, with gemma-tpu:cluster.multiTierCheckpointing, the bucket GKE's node
replicator backs the local tier up to (infra.cloud.checkpointing)."""

from collections.abc import Sequence

import pulumi
import pulumi_gcp as gcp

from infra.cloud.checkpointing import backup_bucket
from infra.cloud.component import Component
from infra.config import StackConfig


class Buckets(Component):
    """`data` and `artifacts`: private buckets (uniform access, public access prevented) with a
    hierarchical namespace, which the GCS FUSE CSI driver mounts with real directories.

    On `pulumi destroy`: with `protect` neither is deleted (destroy stops); otherwise the data
    bucket is deleted (with its objects when `force_destroy`), and the artifacts bucket too unless
    `keep_artifacts`, which leaves it and its checkpoints in the project, outside the stack.
    """

    def __init__(self, name: str, config: StackConfig, *, after: Sequence[pulumi.Resource] = (), opts=None):
        super().__init__("Buckets", name, after=after, opts=opts)
        self.data = self._bucket("data", config.data_bucket, config, keep=False)
        self.artifacts = self._bucket("artifacts", config.artifacts_bucket, config, keep=config.keep_artifacts)
        # Hierarchical namespace is what the replicator needs of it (atomic folder renames). Deleted like the
        # data bucket: its backups are of steps the persistent tier (artifacts) also saves, less often.
        self.multi_tier = (self._bucket("multi-tier", backup_bucket(config), config, keep=False)
                           if config.multi_tier else None)
        self.register_outputs({"data": self.data.url, "artifacts": self.artifacts.url,
                               **({"multi_tier": self.multi_tier.url} if self.multi_tier else {})})

    def _bucket(self, role: str, bucket_name: str, config: StackConfig, *, keep: bool) -> gcp.storage.Bucket:
        return gcp.storage.Bucket(
            f"{role}-bucket",
            gcp.storage.BucketArgs(
                name=bucket_name,
                location=config.region.upper(),  # beside the cluster: no cross-region reads
                uniform_bucket_level_access=True,
                public_access_prevention="enforced",
                hierarchical_namespace=gcp.storage.BucketHierarchicalNamespaceArgs(enabled=True),
                force_destroy=config.force_destroy and not keep,  # a kept bucket is never emptied by Pulumi
            ),
            opts=self.child(protect=config.protect, retain_on_delete=keep),
        )
