"""Every object rendered for every shipped stack is valid for the API server, strictly."""

import copy

import jsonschema
import pytest

from tests.workloads.conftest import STACKS, edited_config, spec_of, stack_config
from tests.workloads.schemas import (
    KUEUE_GROUP,
    jobset_validator,
    kueue_rule_errors,
    kueue_validators,
    validate_builtin,
    validate_jobset,
    validate_kueue,
)
from workloads import manifests
from workloads.__main__ import stack_objects


@pytest.fixture(scope="module")
def jobset_schema():
    return jobset_validator()


@pytest.fixture(scope="module")
def kueue_schemas():
    return kueue_validators()


def _is_kueue(obj) -> bool:
    return obj["apiVersion"].startswith(f"{KUEUE_GROUP}/")


def validate(obj, request):
    if obj["kind"] == "JobSet":
        validate_jobset(obj, request.getfixturevalue("jobset_schema"))  # skips without the CRD
    elif _is_kueue(obj):
        validate_kueue(obj, request.getfixturevalue("kueue_schemas"))  # skips without Kueue's CRDs
    else:
        validate_builtin(obj)


@pytest.mark.parametrize("stack", STACKS)
def test_every_object_of_every_stack_validates_strictly(stack, request):
    # Kueue's objects last: without its CRDs they skip, after everything else has been checked.
    for obj in sorted(stack_objects(stack_config(stack)), key=_is_kueue):
        validate(obj, request)


@pytest.mark.parametrize("stack", STACKS)
def test_optional_parts_validate_too(stack, request):
    """Profiling (a port), Spot (a selector) and a gs:// dataset in another bucket (one more volume)."""
    config = edited_config(
        stack, tpu={"capacity": "spot"}, training={"profiling": True, "dataset": "gs://corpora/tiny/train.txt"}
    )
    for obj in sorted(stack_objects(config), key=_is_kueue):
        validate(obj, request)


@pytest.mark.parametrize("capacity", ["on-demand", "flex-start", "spot"])
def test_the_queue_objects_meet_kueues_webhook_rules_even_without_its_crds(capacity):
    """The rules Kueue's webhooks and CEL enforce beyond the schema (flavor resources in the order of
    coveredResources, one group per resource, limits only with a cohort, tolerations), and names
    the API server takes, checked whether or not kueue-crds.yaml is at hand."""
    config = edited_config("queued", tpu={"capacity": capacity})
    objects = [obj for obj in stack_objects(config) if _is_kueue(obj)]
    assert {obj["kind"] for obj in objects} >= {"ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass"}
    for obj in objects:
        assert kueue_rule_errors(obj) == [], obj["metadata"]["name"]
        validate_builtin({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]})
    broken = next(obj for obj in objects if obj["kind"] == "ClusterQueue")
    broken["spec"]["resourceGroups"][0]["flavors"][0]["resources"].reverse()
    assert "in order" in kueue_rule_errors(broken)[0]


def test_builtin_validation_catches_a_misspelt_field():
    job = manifests.training_job(spec_of(stack_config("dev")))
    validate_builtin(job)
    misspelt = copy.deepcopy(job)
    misspelt["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(jsonschema.ValidationError, match="volumeMount"):
        validate_builtin(misspelt)


def test_jobset_validation_catches_a_misspelt_field_at_any_depth(jobset_schema):
    jobset = manifests.training_jobset(spec_of(stack_config("multislice")))
    validate_jobset(jobset, jobset_schema)
    top = copy.deepcopy(jobset)
    top["spec"]["failurePolicy"]["maxRestart"] = 3
    pod = copy.deepcopy(jobset)
    pod["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeSelectors"] = {}
    metadata = copy.deepcopy(jobset)
    metadata["metadata"]["annotation"] = {}
    for broken, field in ((top, "maxRestart"), (pod, "nodeSelectors"), (metadata, "annotation")):
        with pytest.raises(jsonschema.ValidationError, match=field):
            validate_jobset(broken, jobset_schema)


def test_jobset_validation_checks_types_and_int_or_string(jobset_schema):
    jobset = manifests.training_jobset(spec_of(stack_config("multihost")))
    wrong_type = copy.deepcopy(jobset)
    wrong_type["spec"]["replicatedJobs"][0]["replicas"] = "2"
    with pytest.raises(jsonschema.ValidationError):
        validate_jobset(wrong_type, jobset_schema)
    int_or_string = copy.deepcopy(jobset)
    container = int_or_string["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    container["resources"]["limits"]["google.com/tpu"] = 4  # a quantity may be a number or a string
    validate_jobset(int_or_string, jobset_schema)
