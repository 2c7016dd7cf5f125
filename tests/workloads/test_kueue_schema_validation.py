"""The Kueue validators (tests/workloads/schemas.py) accept minimal objects of each kind we use and
reject what the API server or Kueue's webhooks would: a misspelt field at any depth, a wrong
apiVersion, a flavor whose resources do not follow coveredResources."""

import copy

import jsonschema
import pytest

from tests.workloads.schemas import kueue_validators, validate_kueue

API = "kueue.x-k8s.io/v1beta2"
FLAVOR = {
    "apiVersion": API,
    "kind": "ResourceFlavor",
    "metadata": {"name": "tpu-v5p-2x2x2"},
    "spec": {
        "nodeLabels": {
            "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
            "cloud.google.com/gke-tpu-topology": "2x2x2",
        },
        "tolerations": [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
}
CLUSTER_QUEUE = {
    "apiVersion": API,
    "kind": "ClusterQueue",
    "metadata": {"name": "gemma-tpu"},
    "spec": {
        "namespaceSelector": {},
        "queueingStrategy": "BestEffortFIFO",
        "resourceGroups": [
            {
                "coveredResources": ["cpu", "memory", "google.com/tpu"],
                "flavors": [
                    {
                        "name": "tpu-v5p-2x2x2",
                        "resources": [
                            {"name": "cpu", "nominalQuota": "1000"},
                            {"name": "memory", "nominalQuota": "4000Gi"},
                            {"name": "google.com/tpu", "nominalQuota": 16},
                        ],
                    }
                ],
            }
        ],
        "preemption": {"withinClusterQueue": "LowerPriority"},
        "admissionChecksStrategy": {"admissionChecks": [{"name": "tpu-provisioning"}]},
        "stopPolicy": "None",
    },
}
LOCAL_QUEUE = {
    "apiVersion": API,
    "kind": "LocalQueue",
    "metadata": {"name": "training", "namespace": "gemma"},
    "spec": {"clusterQueue": "gemma-tpu"},
}
PRIORITY_CLASS = {
    "apiVersion": API,
    "kind": "WorkloadPriorityClass",
    "metadata": {"name": "training-high"},
    "value": 1000,
    "description": "Gemma fine-tuning runs",
}
ADMISSION_CHECK = {
    "apiVersion": API,
    "kind": "AdmissionCheck",
    "metadata": {"name": "tpu-provisioning"},
    "spec": {
        "controllerName": "kueue.x-k8s.io/provisioning-request",
        "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig", "name": "tpu-flex"},
    },
}
PROVISIONING_CONFIG = {
    "apiVersion": API,
    "kind": "ProvisioningRequestConfig",
    "metadata": {"name": "tpu-flex"},
    "spec": {
        "provisioningClassName": "queued-provisioning.gke.io",
        "managedResources": ["google.com/tpu"],
        "retryStrategy": {"backoffLimitCount": 1, "backoffBaseSeconds": 60, "backoffMaxSeconds": 1800},
    },
}
MINIMAL = (FLAVOR, CLUSTER_QUEUE, LOCAL_QUEUE, PRIORITY_CLASS, ADMISSION_CHECK, PROVISIONING_CONFIG)


@pytest.fixture(scope="module")
def kueue_schemas():
    return kueue_validators()  # skips without kueue-crds.yaml


def test_every_kind_we_use_is_served_as_v1beta2(kueue_schemas):
    for obj in MINIMAL:
        assert kueue_schemas[obj["kind"]].schema["properties"]["apiVersion"] == {"const": API}


@pytest.mark.parametrize("obj", MINIMAL, ids=lambda obj: obj["kind"])
def test_minimal_objects_validate(obj, kueue_schemas):
    validate_kueue(obj, kueue_schemas)


def test_a_misspelt_field_is_caught_at_any_depth(kueue_schemas):
    quota = copy.deepcopy(CLUSTER_QUEUE)
    quota["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]["nominalQuotas"] = 16
    strategy = copy.deepcopy(CLUSTER_QUEUE)
    strategy["spec"]["admissionChecksStrategy"]["admissionChecks"][0]["onFlavor"] = []
    top = copy.deepcopy(CLUSTER_QUEUE)
    top["spec"]["cohort"] = "gemma"  # v1beta1's name; v1beta2 spells it cohortName
    metadata = copy.deepcopy(CLUSTER_QUEUE)
    metadata["metadata"]["label"] = {}
    for broken, field in ((quota, "nominalQuotas"), (strategy, "onFlavor"), (top, "cohort"), (metadata, "label")):
        with pytest.raises(jsonschema.ValidationError, match=field):
            validate_kueue(broken, kueue_schemas)


def test_types_enums_and_quantities_are_checked(kueue_schemas):
    float_quota = copy.deepcopy(CLUSTER_QUEUE)
    float_quota["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]["nominalQuota"] = 1.5
    bad_quantity = copy.deepcopy(CLUSTER_QUEUE)
    bad_quantity["spec"]["resourceGroups"][0]["flavors"][0]["resources"][1]["nominalQuota"] = "4 TB"
    strategy = copy.deepcopy(CLUSTER_QUEUE)
    strategy["spec"]["queueingStrategy"] = "FIFO"
    no_value = {k: v for k, v in PRIORITY_CLASS.items() if k != "value"}
    bad_kind = copy.deepcopy(ADMISSION_CHECK)
    bad_kind["spec"]["parameters"]["kind"] = "Provisioning_Request_Config"
    for broken in (float_quota, bad_quantity, strategy, no_value, bad_kind):
        with pytest.raises(jsonschema.ValidationError):
            validate_kueue(broken, kueue_schemas)


def test_api_version_kind_name_and_scope_are_checked(kueue_schemas):
    old = copy.deepcopy(LOCAL_QUEUE) | {"apiVersion": "kueue.x-k8s.io/v1alpha1"}
    unknown = copy.deepcopy(LOCAL_QUEUE) | {"kind": "Queue"}
    bad_name = copy.deepcopy(FLAVOR)
    bad_name["metadata"]["name"] = "TPU_v5p"
    namespaced = copy.deepcopy(CLUSTER_QUEUE)
    namespaced["metadata"]["namespace"] = "gemma"  # a ClusterQueue is cluster-scoped
    for broken in (old, unknown, bad_name, namespaced):
        with pytest.raises(jsonschema.ValidationError):
            validate_kueue(broken, kueue_schemas)


def test_flavor_resources_follow_covered_resources_in_order(kueue_schemas):
    swapped = copy.deepcopy(CLUSTER_QUEUE)
    resources = swapped["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    resources[0], resources[1] = resources[1], resources[0]
    missing = copy.deepcopy(CLUSTER_QUEUE)
    del missing["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]
    twice = copy.deepcopy(CLUSTER_QUEUE)
    twice["spec"]["resourceGroups"].append(copy.deepcopy(twice["spec"]["resourceGroups"][0]))
    borrowing = copy.deepcopy(CLUSTER_QUEUE)
    borrowing["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]["borrowingLimit"] = 8
    negative = copy.deepcopy(CLUSTER_QUEUE)
    negative["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]["nominalQuota"] = "-16"
    on_flavors = copy.deepcopy(CLUSTER_QUEUE)
    on_flavors["spec"]["admissionChecksStrategy"]["admissionChecks"][0]["onFlavors"] = ["tpu-v6e"]
    for broken, message in (
        (swapped, "in order"),
        (missing, "in order"),
        (twice, "another resource group"),
        (borrowing, "cohortName"),
        (negative, "non-negative"),
        (on_flavors, "no flavor of the queue"),
    ):
        with pytest.raises(jsonschema.ValidationError, match=message):
            validate_kueue(broken, kueue_schemas)
    with_cohort = copy.deepcopy(borrowing)
    with_cohort["spec"]["cohortName"] = "gemma"
    validate_kueue(with_cohort, kueue_schemas)


def test_resource_flavor_rules(kueue_schemas):
    topology = copy.deepcopy(FLAVOR)
    topology["spec"] = {"topologyName": "tpu-topology"}
    toleration = copy.deepcopy(FLAVOR)
    toleration["spec"]["tolerations"][0]["value"] = "present"
    taints = copy.deepcopy(FLAVOR)
    taints["spec"]["nodeTaints"] = [{"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}] * 2
    for broken in (topology, toleration, taints):
        with pytest.raises(jsonschema.ValidationError):
            validate_kueue(broken, kueue_schemas)
