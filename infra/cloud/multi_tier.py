"""Component: GKE's multi-tier checkpointing (gemma-tpu:cluster.multiTierCheckpointing) beyond the cluster's
addon (infra.cloud.cluster): the node replicator's access to its backup bucket (infra.cloud.storage) and the
CheckpointConfiguration of the stack's TPU pools (infra.cloud.checkpointing), which GKE's controller turns
into the DaemonSet that serves the pods' volume."""

from collections.abc import Sequence

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra.cloud.checkpointing import checkpoint_configurations, replicator_principal
from infra.cloud.cluster import GkeCluster
from infra.cloud.component import Component
from infra.cloud.identity import WRITE_ROLE
from infra.cloud.storage import Buckets
from infra.config import StackConfig


class MultiTierCheckpointing(Component):
    """`access` (the bucket role of the replicator's Kubernetes account) and `configurations`."""

    def __init__(self, name: str, config: StackConfig, cluster: GkeCluster, buckets: Buckets, *,
                 after: Sequence[pulumi.Resource] = (), opts=None):
        super().__init__("MultiTierCheckpointing", name, after=after, opts=opts)
        # The principal names the project by number, which only the API knows.
        number = gcp.organizations.get_project_output(project_id=config.project).number
        self.access = gcp.storage.BucketIAMMember(
            "replicator-backup-access",
            bucket=buckets.multi_tier.name, role=WRITE_ROLE,
            member=number.apply(lambda project_number: replicator_principal(project_number, config)),
            opts=self.child(),
        )
        # The CRD exists once the addon is on: after the cluster. A changed spec is not applied to the
        # DaemonSet GKE's controller made from it (../shared/mtc/checkpointconfiguration-fields.md):
        # replaced, the old one deleted first (its RAM disks go with it).
        self.configurations = [
            k8s.apiextensions.CustomResource(
                obj["metadata"]["name"], api_version=obj["apiVersion"], kind=obj["kind"], metadata=obj["metadata"],
                spec=obj["spec"],
                opts=self.child(*cluster.ready, self.access, provider=cluster.provider, replace_on_changes=["spec"],
                                delete_before_replace=True),
            )
            for obj in checkpoint_configurations(config)
        ]
        self.register_outputs({})
