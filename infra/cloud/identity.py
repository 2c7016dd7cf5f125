"""Who the pods are: one Google service account per job kind with bucket-level roles only, each
acting through its own Kubernetes ServiceAccount in the namespace (Workload Identity).

Training reads the data bucket and writes the artifacts bucket; data preparation, the only writer
of the data bucket, writes there and nowhere else.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra.cloud.accounts import namespace_object, service_account_object
from infra.cloud.cluster import GkeCluster
from infra.cloud.component import Component, service_account_member
from infra.cloud.storage import Buckets
from infra.config import StackConfig

READ_ROLE = "roles/storage.objectViewer"
WRITE_ROLE = "roles/storage.objectUser"  # read, write and delete objects


@dataclass(frozen=True, kw_only=True)
class PodIdentity:
    """A Google service account, the Kubernetes ServiceAccount that acts as it, and every binding
    (bucket roles, Workload Identity) that pods running as it wait for."""

    google_service_account: gcp.serviceaccount.Account
    service_account: k8s.core.v1.ServiceAccount
    bindings: list[pulumi.Resource]


class TrainingIdentity(Component):
    """`namespace`, `training` and `preparation` (PodIdentity each)."""

    def __init__(self, name: str, config: StackConfig, cluster: GkeCluster, buckets: Buckets, *, after: Sequence[pulumi.Resource] = (), opts=None):
        super().__init__("TrainingIdentity", name, after=after, opts=opts)
        self._config = config
        self._cluster = cluster
        self.namespace = k8s.core.v1.Namespace(
            "training-namespace", metadata=namespace_object(config.namespace)["metadata"], opts=self._on_cluster()
        )
        self.training = self.pod_identity(
            "training",
            account_id=config.training_service_account_id,
            description="Training pods",
            service_account=config.service_account,
            grants=(("reads-data", buckets.data, READ_ROLE), ("writes-artifacts", buckets.artifacts, WRITE_ROLE)),
        )
        self.preparation = self.pod_identity(
            "preparation",
            account_id=config.preparation_service_account_id,
            description="Data preparation pods",
            service_account=config.preparation_service_account,
            grants=(("writes-data", buckets.data, WRITE_ROLE),),
        )
        self.register_outputs(
            {"training": self.training.google_service_account.email, "preparation": self.preparation.google_service_account.email}
        )

    def _on_cluster(self) -> pulumi.ResourceOptions:
        return self.child(*self._cluster.ready, provider=self._cluster.provider)

    def pod_identity(
        self, label: str, *, account_id: str, description: str, service_account: str,
        grants: Sequence[tuple[str, gcp.storage.Bucket, str]],
    ) -> PodIdentity:  # fmt: skip
        config = self._config
        account = gcp.serviceaccount.Account(
            label,
            gcp.serviceaccount.AccountArgs(account_id=account_id, display_name=f"{description} of {config.cluster_name}"),
            opts=self.child(),
        )
        member = service_account_member(account)
        bindings: list[pulumi.Resource] = [
            gcp.storage.BucketIAMMember(
                f"{label}-{grant}",
                gcp.storage.BucketIAMMemberArgs(bucket=bucket.name, role=role, member=member),
                opts=self.child(),
            )
            for grant, bucket, role in grants
        ]
        kubernetes_account = k8s.core.v1.ServiceAccount(
            f"{label}-service-account",
            metadata=service_account_object(
                service_account, namespace=self.namespace.metadata.name, google_service_account=account.email
            )["metadata"],
            opts=self._on_cluster(),
        )
        # The identity pool exists once the cluster does; only this one ServiceAccount may act as
        # the Google account.
        bindings.append(
            gcp.serviceaccount.IAMMember(
                f"{label}-workload-identity",
                gcp.serviceaccount.IAMMemberArgs(
                    service_account_id=account.name,
                    role="roles/iam.workloadIdentityUser",
                    member=f"serviceAccount:{config.workload_identity_pool}[{config.namespace}/{service_account}]",
                ),
                opts=self.child(self._cluster.cluster),
            )
        )
        return PodIdentity(google_service_account=account, service_account=kubernetes_account, bindings=bindings)
