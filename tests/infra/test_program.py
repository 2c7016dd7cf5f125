"""The whole program in one graph: the trainer image, then data preparation, then training, as
`python -m infra.preview --stack NAME --json` lists them, and the stack outputs to watch the run."""

import json

import pytest

from infra.config import parse_stack_config
from infra.preview import PLACEHOLDER_DIGEST, main, preview
from tests.infra.conftest import of_type, one, previewed, stack_values
from workloads import manifests
from workloads.spec import run_spec

IMAGE_BUILD = "docker-build:index:Image"
JOB = "kubernetes:batch/v1:Job"
JOBSET = "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet"


def _images(obj_inputs: dict) -> set[str]:
    """Every container image of a Job's or JobSet's pods (init containers included)."""
    found = set()

    def walk(value):
        if isinstance(value, dict):
            if "image" in value and "name" in value:
                found.add(value["image"])
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(obj_inputs["spec"])
    return found


@pytest.mark.parametrize(("stack", "training_type"), [("dev", JOB), ("multislice", JOBSET)])
def test_json_lists_image_build_then_preparation_then_training(stack, training_type, capsys):
    assert main(["--stack", stack, "--json"]) == 0
    graph = json.loads(capsys.readouterr().out)
    (build,) = [r for r in graph if r["type"] == IMAGE_BUILD]
    (prepare,) = [r for r in graph if r["type"] == JOB and r["name"] == "prepare-data"]
    (training,) = [r for r in graph if r["type"] == training_type and r["name"] == "training"]
    assert build["name"] in prepare["dependsOn"]
    assert {build["name"], prepare["name"]} <= set(training["dependsOn"])
    # Pods run the pushed build, pinned by digest: the objects are concrete in the preview.
    pushed = f"{build['inputs']['tags'][0]}@{PLACEHOLDER_DIGEST}"
    assert _images(prepare["inputs"]) == _images(training["inputs"]) == {pushed}
    # Training waits for its TPU pools; data preparation, on CPU nodes, does not.
    pools = {r["name"] for r in graph if r["type"] == "gcp:container/nodePool:NodePool" and r["parent"] == "tpu"}
    assert pools and pools <= set(training["dependsOn"]) and not pools & set(prepare["dependsOn"])


@pytest.mark.parametrize("stack", ["dev", "multislice"])
def test_each_job_waits_for_its_own_identity(stack):
    resources = previewed(stack).resources
    prepare = one(resources, JOB, "prepare-data")
    (training,) = [r for r in resources if r.name == "training" and r.type in (JOB, JOBSET)]
    assert {"preparation-service-account", "preparation-writes-data", "preparation-workload-identity"} <= set(prepare.depends_on)
    assert {
        "training-service-account", "training-reads-data", "training-writes-artifacts", "training-workload-identity", "jobset",
    } <= set(training.depends_on)  # fmt: skip


def test_a_configured_image_is_run_as_is_and_nothing_is_built():
    configured = "ghcr.io/acme/trainer:1@sha256:" + "1" * 64
    resources = preview(stack_values("dev", **{"gemma-tpu:image": configured}), "dev").resources
    assert of_type(resources, IMAGE_BUILD) == []
    for job in of_type(resources, JOB):
        assert _images(job.inputs) == {configured}


@pytest.mark.parametrize("stack", ["dev", "multihost", "multislice", "autopilot"])
def test_outputs_tell_how_to_watch_the_run(stack):
    result = previewed(stack)
    outputs = result.outputs
    (build,) = of_type(result.resources, IMAGE_BUILD)
    config = parse_stack_config(stack_values(stack), stack)
    spec = run_spec(config, config.runs[0], image=f"{build.inputs['tags'][0]}@{PLACEHOLDER_DIGEST}")
    assert outputs["trainingRun"] == spec.name
    assert outputs["trainingStatus"] == manifests.status_command(spec)
    assert outputs["trainingLogs"] == manifests.logs_command(spec)
    assert outputs["tensorboardDir"] == f"gs://{spec.artifacts_bucket}/runs/{spec.name}/tensorboard"


def test_the_watch_commands_are_these_kubectl_lines():
    """Written out for one Job stack and one JobSet stack: a wrong label, flag or kind in the builders
    shows here (the run's name carries a hash of the image, so it is taken from the outputs)."""
    dev = previewed("dev").outputs
    run = dev["trainingRun"]
    assert run.startswith("gemma-finetune-")
    assert dev["trainingStatus"] == f"kubectl get job {run} -n training"
    assert dev["trainingLogs"] == f"kubectl logs -n training -f job/{run} -c trainer"
    multihost = previewed("multihost").outputs
    run = multihost["trainingRun"]
    assert multihost["trainingStatus"] == f"kubectl get jobset {run} -n training"
    assert multihost["trainingLogs"] == (
        f"kubectl logs -n training -f -l jobset.sigs.k8s.io/jobset-name={run},jobset.sigs.k8s.io/job-index=0,"
        "batch.kubernetes.io/job-completion-index=0 -c trainer"
    )
