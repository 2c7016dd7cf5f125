"""Every object rendered for every shipped stack is valid for the API server, strictly."""

import copy

import jsonschema
import pytest

from tests.workloads.admission_serving import validate_pod_monitoring
from tests.workloads.conftest import STACKS, edited_config, spec_of, stack_config
from tests.workloads.schemas import (
    KUEUE_GROUP,
    checkpoint_configuration_errors,
    checkpoint_configuration_validator,
    jobset_validator,
    kueue_reference_errors,
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
def checkpoint_configuration_schema():
    return checkpoint_configuration_validator()  # skips without the CRD


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
    elif obj["kind"] == "CheckpointConfiguration":  # gemma-tpu:cluster.multiTierCheckpointing's
        assert checkpoint_configuration_errors(obj, *request.getfixturevalue("checkpoint_configuration_schema")) == []
    elif obj["kind"] == "PodMonitoring":  # gemma-tpu:serving's
        validate_pod_monitoring(obj)
    else:
        validate_builtin(obj)


@pytest.mark.parametrize("stack", STACKS)
def test_every_object_of_every_stack_validates_strictly(stack, request):
    # Kueue's objects last: without its CRDs they skip, after everything else has been checked.
    for obj in sorted(stack_objects(stack_config(stack)), key=_is_kueue):
        validate(obj, request)


@pytest.mark.parametrize("stack", STACKS)
def test_optional_parts_validate_too(stack, request):
    """Profiling (a port), Spot (a selector), a gs:// dataset in another bucket (one more volume) and the
    local checkpoint tier (a memory volume)."""
    config = edited_config(stack, tpu={"capacity": "spot"}, training={
        "profiling": True, "dataset": "gs://corpora/tiny/train.txt", "localCheckpointInterval": "auto"})
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


def _references_broken(edit) -> list[str]:
    objects = copy.deepcopy(stack_objects(stack_config("queued")))
    edit({(obj["kind"], obj["metadata"]["name"]): obj for obj in objects})
    return kueue_reference_errors(objects)


@pytest.mark.parametrize("capacity", ["on-demand", "flex-start"])
def test_every_kueue_reference_of_a_queued_stack_resolves(capacity):
    assert kueue_reference_errors(stack_objects(edited_config("queued", tpu={"capacity": capacity}))) == []


def _first(objects, kind):
    return next(obj for (k, _), obj in objects.items() if k == kind)


# (what breaks, how, a word of the error)
REFERENCE_BREAKS = {
    "a flavor the queue does not name": (lambda o: _first(o, "ResourceFlavor")["metadata"].update(name="v6e-2x4"), "ResourceFlavor"),
    "a check of another kind": (lambda o: _first(o, "AdmissionCheck")["spec"]["parameters"].update(kind="ConfigMap"), "parameters"),
    "a check the queue names, gone": (lambda o: _first(o, "AdmissionCheck")["metadata"].update(name="dws"), "AdmissionCheck flex-start"),
    "a local queue of another ClusterQueue": (lambda o: _first(o, "LocalQueue")["spec"].update(clusterQueue="team"), "ClusterQueue team"),
    "a local queue in a namespace the queue does not select":
        (lambda o: _first(o, "LocalQueue")["metadata"].update(namespace="research"), "does not"),
    "a run's priority the stack does not create":
        (lambda o: _first(o, "JobSet")["metadata"]["labels"].update({"kueue.x-k8s.io/priority-class": "urgent"}), "urgent"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(REFERENCE_BREAKS))
def test_each_broken_kueue_reference_is_found(case):
    edit, message = REFERENCE_BREAKS[case]
    errors = _references_broken(edit)
    assert errors and any(message in error for error in errors), errors


def test_kueue_labels_and_tolerations_are_valid_labels():
    config = edited_config("queued")
    flavor = next(obj for obj in stack_objects(config) if obj["kind"] == "ResourceFlavor")
    flavor["spec"]["tolerations"][1]["value"] = "present!"
    flavor["spec"]["nodeLabels"]["cloud.google.com/gke tpu"] = "x"
    assert len(kueue_rule_errors(flavor)) == 2


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


def _checkpoint_configuration(stack: str) -> dict:
    (obj,) = [obj for obj in stack_objects(stack_config(stack)) if obj["kind"] == "CheckpointConfiguration"]
    return obj


@pytest.mark.parametrize("break_it, found", [
    (lambda spec: spec.update(mountOptions=["implicit-dirs"]), "Additional properties"),  # what xpk's template sets
    (lambda spec: spec.update(inMemoryVolumeSize=6144), "is not of type 'string'"),
    (lambda spec: spec.update(inMemoryVolumeSize="6 GiB"), "is not a quantity"),
    (lambda spec: spec.update(cloudStorageBucketName="gs://my-project-multislice-mtc"), "bare bucket name"),
    (lambda spec: spec["tolerations"][0].update(effect=1), "is not of type 'string'"),
])
def test_a_checkpoint_configuration_the_crd_or_gkes_controller_refuses_is_found(break_it, found, checkpoint_configuration_schema):
    obj = copy.deepcopy(_checkpoint_configuration("multislice"))
    assert checkpoint_configuration_errors(obj, *checkpoint_configuration_schema) == []
    break_it(obj["spec"])
    assert any(found in error for error in checkpoint_configuration_errors(obj, *checkpoint_configuration_schema))
