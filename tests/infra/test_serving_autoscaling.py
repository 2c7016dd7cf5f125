"""Serving with `autoscaling` under Pulumi mocks: the Custom Metrics Stackdriver Adapter that its
HorizontalPodAutoscaler reads, pinned and installed before it, reading Cloud Monitoring as an account
of its own that holds roles/monitoring.viewer alone, for the adapter's ServiceAccount alone; and the
managed collection that puts vLLM's metric in Monitoring."""

import re

import pulumi
import pytest

from infra.config import STACK_NAME_MAX
from infra.config.serving import metrics_adapter_account_id
from infra.observability.metrics_adapter import ADAPTER_MANIFESTS, acting_as
from infra.preview import preview
from tests.infra.conftest import PROJECT_ID, of_type, one, previewed, stack_values
from tests.infra.config.test_account_names import GOOGLE_ACCOUNT_ID
from tests.infra.cloud.test_destroy import prerequisites
from tests.infra.test_serving import serving_preview

CONFIG_FILE = "kubernetes:yaml/v2:ConfigFile"
HPA = "kubernetes:autoscaling/v2:HorizontalPodAutoscaler"
ADAPTER_EMAIL = f"gemma-serving-hpa@{PROJECT_ID}.iam.gserviceaccount.com"
ADAPTER_KSA = f"serviceAccount:{PROJECT_ID}.svc.id.goog[custom-metrics/custom-metrics-stackdriver-adapter]"
IAM_TYPES = ("gcp:projects/iAMMember:IAMMember", "gcp:serviceaccount/iAMMember:IAMMember", "gcp:storage/bucketIAMMember:BucketIAMMember",
             "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember")  # fmt: skip
AUTOSCALING = {"maxReplicas": 3, "queueDepth": 8}


def autoscaled(**values):
    return serving_preview(autoscaling=AUTOSCALING, **values).resources


def grants(resources) -> set[tuple[str, str, str]]:
    """(type, role, member) of every IAM grant the stack makes."""
    return {(r.type, r.inputs["role"], r.inputs["member"]) for type_ in IAM_TYPES for r in of_type(resources, type_)}


def adapter_parts(resources) -> list[str]:
    return [r.name for r in resources if "metrics-adapter" in r.name or r.type == "gemma-tpu:infra:MetricsAdapter"]


def test_the_adapter_and_its_grants_exist_only_with_autoscaling():
    plain = previewed("serving").resources
    assert adapter_parts(plain) == [] and not [r for r in of_type(plain, HPA)]
    assert not [g for g in grants(plain) if "monitoring" in g[1] or ADAPTER_EMAIL in g[2]]
    scaled = autoscaled()
    assert sorted(adapter_parts(scaled)) == sorted(["metrics-adapter", "metrics-adapter", "metrics-adapter-reads-monitoring",
                                                    "metrics-adapter-workload-identity", "custom-metrics-adapter"])  # fmt: skip
    # Everything else in the stack is as it was: only the adapter's account, grants and install are new.
    assert grants(scaled) - grants(plain) == {
        ("gcp:projects/iAMMember:IAMMember", "roles/monitoring.viewer", f"serviceAccount:{ADAPTER_EMAIL}"),
        ("gcp:serviceaccount/iAMMember:IAMMember", "roles/iam.workloadIdentityUser", ADAPTER_KSA),
    }


def test_the_adapters_account_only_reads_monitoring_and_only_the_adapter_acts_as_it():
    resources = autoscaled()
    account = one(resources, "gcp:serviceaccount/account:Account", "metrics-adapter").inputs
    assert account["accountId"] == "gemma-serving-hpa"
    held = [(r.type, r.inputs["role"]) for type_ in IAM_TYPES for r in of_type(resources, type_)
            if r.inputs["member"] == f"serviceAccount:{ADAPTER_EMAIL}"]  # fmt: skip
    assert held == [("gcp:projects/iAMMember:IAMMember", "roles/monitoring.viewer")]
    assert one(resources, "gcp:projects/iAMMember:IAMMember", "metrics-adapter-reads-monitoring").inputs["project"] == PROJECT_ID
    acting = [r.inputs for r in of_type(resources, "gcp:serviceaccount/iAMMember:IAMMember")
              if r.inputs["serviceAccountId"].endswith(f"/serviceAccounts/{ADAPTER_EMAIL}")]  # fmt: skip
    assert acting == [{"serviceAccountId": f"projects/{PROJECT_ID}/serviceAccounts/{ADAPTER_EMAIL}",
                       "role": "roles/iam.workloadIdentityUser", "member": ADAPTER_KSA}]  # fmt: skip


def test_the_adapters_account_id_fits_for_the_longest_stack_name():
    assert GOOGLE_ACCOUNT_ID.match(metrics_adapter_account_id(f"gemma-{'s' * STACK_NAME_MAX}"))


def test_the_adapter_is_a_pinned_release_manifest_applied_after_its_grants():
    install = one(autoscaled(), CONFIG_FILE, "custom-metrics-adapter")
    assert install.inputs["file"] == ADAPTER_MANIFESTS
    pinned = (r"https://raw\.githubusercontent\.com/GoogleCloudPlatform/k8s-stackdriver/[0-9a-f]{40}/"
              r"custom-metrics-stackdriver-adapter/deploy/production/adapter_new_resource_model\.yaml")
    assert re.fullmatch(pinned, ADAPTER_MANIFESTS)  # a commit, never a branch
    assert install.provider == "gke"
    assert {"gemma-serving", "cpu", "metrics-adapter-reads-monitoring", "metrics-adapter-workload-identity"} <= set(install.depends_on)


def test_the_autoscaler_reads_vllms_queue_through_the_adapter_and_goes_before_it():
    resources = autoscaled()
    hpa = one(resources, HPA, "vllm")
    # Destroy deletes the autoscaler before the adapter that serves its metric, and keeps neither.
    assert (CONFIG_FILE, "custom-metrics-adapter") in prerequisites(resources, hpa)
    adapter = [r for r in resources if r.name in adapter_parts(resources)]
    assert not [r.name for r in adapter if r.protect or r.retain_on_delete]
    # The adapter's form of a Managed Service for Prometheus metric: prometheus.googleapis.com|NAME|KIND,
    # per pod (the custom metrics API), which it reads as Monitoring's prometheus.googleapis.com/NAME/KIND.
    (metric,) = hpa.inputs["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"] == {"metric": {"name": "prometheus.googleapis.com|vllm:num_requests_waiting|gauge"},
                              "target": {"type": "AverageValue", "averageValue": "8"}}  # fmt: skip


def _transformed(type_: str, metadata: dict):
    props = {"metadata": metadata, "spec": {}}
    args = pulumi.ResourceTransformArgs(custom=True, type_=type_, name="x", props=props, opts=pulumi.ResourceOptions())
    return acting_as(ADAPTER_EMAIL)(args)


def test_the_manifests_adapter_service_account_is_annotated_with_the_google_account_and_nothing_else_changes():
    adapter_ksa = {"name": "custom-metrics-stackdriver-adapter", "namespace": "custom-metrics", "annotations": {"keep": "me"}}
    result = _transformed("kubernetes:core/v1:ServiceAccount", adapter_ksa)
    assert result.props == {"metadata": {**adapter_ksa, "annotations": {"keep": "me", "iam.gke.io/gcp-service-account": ADAPTER_EMAIL}},
                            "spec": {}}  # fmt: skip
    assert _transformed("kubernetes:core/v1:ServiceAccount", {"name": "other", "namespace": "custom-metrics"}) is None
    deployment = {"name": "custom-metrics-stackdriver-adapter", "namespace": "custom-metrics"}
    assert _transformed("kubernetes:apps/v1:Deployment", deployment) is None


@pytest.mark.parametrize("autoscaling", [False, True])
def test_a_standard_cluster_that_serves_turns_on_managed_prometheus_collection(autoscaling):
    resources = autoscaled() if autoscaling else previewed("serving").resources
    cluster = one(resources, "gcp:container/cluster:Cluster").inputs
    assert cluster["monitoringConfig"] == {"managedPrometheus": {"enabled": True}}


def test_autopilot_keeps_its_own_monitoring_config_and_still_gets_the_adapter():
    values = stack_values("serving", **{"gemma-tpu:cluster": {"mode": "autopilot"}})
    values["gemma-tpu:serving"] = {**values["gemma-tpu:serving"], "autoscaling": AUTOSCALING}
    resources = preview(values, "serving").resources
    assert "monitoringConfig" not in one(resources, "gcp:container/cluster:Cluster").inputs  # always on in Autopilot
    assert one(resources, CONFIG_FILE, "custom-metrics-adapter").inputs["file"] == ADAPTER_MANIFESTS


def test_a_stack_without_serving_leaves_the_clusters_monitoring_config_alone():
    assert "monitoringConfig" not in one(previewed("dev").resources, "gcp:container/cluster:Cluster").inputs
