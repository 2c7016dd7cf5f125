"""Google's Custom Metrics Stackdriver Adapter (GoogleCloudPlatform/k8s-stackdriver) at a pinned
commit, for the serving autoscaler (gemma-tpu:serving.autoscaling): it serves the Kubernetes custom
and external metrics APIs from Cloud Monitoring, where Managed Service for Prometheus writes vLLM's
`vllm:num_requests_waiting`. GKE documents the adapter for HPAs on Prometheus metrics
(cloud.google.com/kubernetes-engine/docs/tutorials/autoscaling-metrics).

It reads Cloud Monitoring as a Google service account of its own, as the adapter's README says for
Workload Identity clusters: roles/monitoring.viewer on the project (Monitoring grants reads per
project; the role reads metrics and dashboards, nothing else), and only the manifest's Kubernetes
ServiceAccount may act as it.
"""

from collections.abc import Sequence

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra.cloud.accounts import WORKLOAD_IDENTITY_ANNOTATION
from infra.cloud.cluster import GkeCluster
from infra.cloud.component import Component, service_account_member
from infra.config import StackConfig
from infra.config.serving import metrics_adapter_account_id

# The last change of the production manifest for the new resource model (the one GKE's docs apply):
# image gcr.io/gke-release/custom-metrics-stackdriver-adapter:v0.16.9-gke.0, 2026-08-17. The
# repository's own adapter tags stop at v0.14.0 (2024), so the commit is the pin.
ADAPTER_COMMIT = "af49d863755c0535f598cfde9288ae9a75251d38"
ADAPTER_MANIFESTS = (
    f"https://raw.githubusercontent.com/GoogleCloudPlatform/k8s-stackdriver/{ADAPTER_COMMIT}"
    "/custom-metrics-stackdriver-adapter/deploy/production/adapter_new_resource_model.yaml"
)
# The manifest's Kubernetes ServiceAccount, which the adapter's Deployment runs as.
ADAPTER_NAMESPACE = "custom-metrics"
ADAPTER_SERVICE_ACCOUNT = "custom-metrics-stackdriver-adapter"
MONITORING_READ_ROLE = "roles/monitoring.viewer"


class MetricsAdapter(Component):
    """`account` (the adapter's Google service account), `bindings` (its Monitoring read role and
    the Workload Identity binding) and `install` (the release manifest, applied server-side once
    the bindings exist, its ServiceAccount annotated with `account`). `pulumi destroy` removes all of
    it, after the autoscaler that reads it."""

    def __init__(self, name: str, config: StackConfig, cluster: GkeCluster, *, after: Sequence[pulumi.Resource] = (), opts=None):
        super().__init__("MetricsAdapter", name, after=after, opts=opts)
        self.account = gcp.serviceaccount.Account(
            "metrics-adapter",
            gcp.serviceaccount.AccountArgs(account_id=metrics_adapter_account_id(config.cluster_name),
                                           display_name=f"Custom metrics adapter of {config.cluster_name}"),
            opts=self.child(),
        )  # fmt: skip
        self.bindings: list[pulumi.Resource] = [
            gcp.projects.IAMMember(
                "metrics-adapter-reads-monitoring",
                gcp.projects.IAMMemberArgs(project=config.project, role=MONITORING_READ_ROLE, member=service_account_member(self.account)),
                opts=self.child(),
            ),
            gcp.serviceaccount.IAMMember(
                "metrics-adapter-workload-identity",
                gcp.serviceaccount.IAMMemberArgs(
                    service_account_id=self.account.name,
                    role="roles/iam.workloadIdentityUser",
                    member=f"serviceAccount:{config.workload_identity_pool}[{ADAPTER_NAMESPACE}/{ADAPTER_SERVICE_ACCOUNT}]",
                ),
                opts=self.child(cluster.cluster),  # the identity pool exists once the cluster does
            ),
        ]
        self.install = k8s.yaml.v2.ConfigFile(
            "custom-metrics-adapter",
            k8s.yaml.v2.ConfigFileArgs(file=ADAPTER_MANIFESTS),
            opts=self.child(*cluster.ready, *self.bindings, provider=cluster.provider,
                            transforms=[acting_as(self.account.email)]),  # fmt: skip
        )
        self.register_outputs({"commit": ADAPTER_COMMIT, "account": self.account.email})


def acting_as(email: pulumi.Input[str]) -> pulumi.ResourceTransform:
    """A transform of the manifest's objects that annotates the adapter's ServiceAccount with the
    Google account it acts as (what the README does with `kubectl annotate`), so that the adapter's
    first pod already reads Monitoring as it; every other object passes unchanged."""

    def transform(args: pulumi.ResourceTransformArgs) -> pulumi.ResourceTransformResult | None:
        metadata = args.props.get("metadata") or {}
        if args.type_ != "kubernetes:core/v1:ServiceAccount" or (metadata.get("namespace"), metadata.get("name")) != (
            ADAPTER_NAMESPACE, ADAPTER_SERVICE_ACCOUNT,
        ):  # fmt: skip
            return None
        annotations = {**(metadata.get("annotations") or {}), WORKLOAD_IDENTITY_ANNOTATION: email}
        return pulumi.ResourceTransformResult(props={**args.props, "metadata": {**metadata, "annotations": annotations}}, opts=args.opts)

    return transform
