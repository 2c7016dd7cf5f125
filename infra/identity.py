"""Who the training pods are: a Google service account with bucket-level roles only, the
Kubernetes namespace and ServiceAccount bound to it through Workload Identity."""

from collections.abc import Sequence

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra.cluster import GkeCluster
from infra.component import Component, service_account_member
from infra.config import StackConfig
from infra.storage import Buckets

DATA_ROLE = "roles/storage.objectViewer"  # read the corpus
ARTIFACTS_ROLE = "roles/storage.objectUser"  # read, write and delete checkpoints, logs, profiles
WORKLOAD_IDENTITY_ANNOTATION = "iam.gke.io/gcp-service-account"


class TrainingIdentity(Component):
    """`google_service_account`, `namespace` and `service_account` (Kubernetes), `bindings`."""

    def __init__(self, name: str, config: StackConfig, cluster: GkeCluster, buckets: Buckets, *, after: Sequence[pulumi.Resource] = (), opts=None):
        super().__init__("TrainingIdentity", name, after=after, opts=opts)
        self.google_service_account = gcp.serviceaccount.Account(
            "training",
            gcp.serviceaccount.AccountArgs(
                account_id=config.training_service_account_id,
                display_name=f"Training pods of {config.cluster_name}",
            ),
            opts=self.child(),
        )
        member = service_account_member(self.google_service_account)
        self.bindings = [
            gcp.storage.BucketIAMMember(
                f"training-{label}",
                gcp.storage.BucketIAMMemberArgs(bucket=bucket.name, role=role, member=member),
                opts=self.child(),
            )
            for label, bucket, role in (("reads-data", buckets.data, DATA_ROLE), ("writes-artifacts", buckets.artifacts, ARTIFACTS_ROLE))
        ]
        kubernetes = self.child(*cluster.ready, provider=cluster.provider)
        self.namespace = k8s.core.v1.Namespace(
            "training-namespace",
            k8s.core.v1.NamespaceInitArgs(metadata=k8s.meta.v1.ObjectMetaArgs(name=config.namespace)),
            opts=kubernetes,
        )
        self.service_account = k8s.core.v1.ServiceAccount(
            "training-service-account",
            k8s.core.v1.ServiceAccountInitArgs(
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=config.service_account,
                    namespace=self.namespace.metadata.name,
                    annotations={WORKLOAD_IDENTITY_ANNOTATION: self.google_service_account.email},
                ),
            ),
            opts=kubernetes,
        )
        # The identity pool exists once the cluster does; only this one ServiceAccount may act as
        # the Google account.
        self.bindings.append(
            gcp.serviceaccount.IAMMember(
                "training-workload-identity",
                gcp.serviceaccount.IAMMemberArgs(
                    service_account_id=self.google_service_account.name,
                    role="roles/iam.workloadIdentityUser",
                    member=f"serviceAccount:{config.workload_identity_pool}[{config.namespace}/{config.service_account}]",
                ),
                opts=self.child(cluster.cluster),
            )
        )
        self.register_outputs({"email": self.google_service_account.email})
