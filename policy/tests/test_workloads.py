import pytest
import yaml

from rules.base import Resource
from rules.workloads import (
    NETWORK_TUNING_ANNOTATION,
    check_images_from_stack_registry,
    check_pods_unprivileged,
)

JOB = "kubernetes:batch/v1:Job"
JOBSET = "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet"
CONFIG_GROUP = "kubernetes:yaml/v2:ConfigGroup"
OUR_IMAGE = "us-east5-docker.pkg.dev/my-project/gemma-tpu-dev/trainer:abc123"


def jobset_pod(props: dict) -> dict:
    return props["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def privileged(pod: dict) -> None:
    pod["containers"][0]["securityContext"] = {"privileged": True}


def host_path(pod: dict) -> None:
    pod["volumes"].append({"name": "sys", "hostPath": {"path": "/proc/sys"}})


def host_network(pod: dict) -> None:
    pod["hostNetwork"] = True


def privileged_init(pod: dict) -> None:
    pod["initContainers"] = [{"name": "tune", "image": OUR_IMAGE, "securityContext": {"privileged": True}}]


def test_compliant_workloads_pass(compliant_graph):
    for entry in compliant_graph:
        assert check_pods_unprivileged(entry["type"], entry["inputs"]) == [], entry["name"]


@pytest.mark.parametrize(
    ("make_unsafe", "named"),
    [(privileged, "'trainer' is privileged"), (privileged_init, "'tune' is privileged"),
     (host_path, "hostPath '/proc/sys'"), (host_network, "hostNetwork")],
)
def test_host_access_in_a_jobset_is_reported(graph_entry, make_unsafe, named):
    props = graph_entry("train")["inputs"]
    make_unsafe(jobset_pod(props))
    [problem] = check_pods_unprivileged(JOBSET, props)
    assert named in problem and "JobSet gemma-finetune" in problem and NETWORK_TUNING_ANNOTATION in problem


@pytest.mark.parametrize("make_unsafe", [privileged, privileged_init, host_path, host_network])
def test_the_network_tuning_opt_in_allows_host_access(graph_entry, make_unsafe):
    props = graph_entry("train")["inputs"]
    make_unsafe(jobset_pod(props))
    props["metadata"]["annotations"] = {NETWORK_TUNING_ANNOTATION: "host-network"}
    assert check_pods_unprivileged(JOBSET, props) == []


def test_an_unknown_network_tuning_mode_is_not_an_opt_in(graph_entry):
    props = graph_entry("train")["inputs"]
    privileged(jobset_pod(props))
    props["metadata"]["annotations"] = {NETWORK_TUNING_ANNOTATION: "true"}
    problems = check_pods_unprivileged(JOBSET, props)
    assert len(problems) == 2 and "not a known mode" in problems[0]


@pytest.mark.parametrize("field", ["hostPID", "hostIPC"])
def test_host_pid_and_ipc_are_refused_even_with_the_opt_in(graph_entry, field):
    props = graph_entry("train")["inputs"]
    jobset_pod(props)[field] = True
    props["metadata"]["annotations"] = {NETWORK_TUNING_ANNOTATION: "host-network"}
    [problem] = check_pods_unprivileged(JOBSET, props)
    assert field in problem


def test_a_privileged_typed_job_is_reported(graph_entry):
    props = graph_entry("prepare")["inputs"]
    privileged(props["spec"]["template"]["spec"])
    [problem] = check_pods_unprivileged(JOB, props)
    assert "Job prepare" in problem


def test_objects_inside_a_config_group_are_checked(graph_entry):
    jobset = graph_entry("train")["inputs"]
    host_path(jobset_pod(jobset))
    assert len(check_pods_unprivileged(CONFIG_GROUP, {"objs": [jobset]})) == 1
    assert len(check_pods_unprivileged(CONFIG_GROUP, {"yaml": yaml.safe_dump_all([{"kind": "Namespace"}, jobset])})) == 1
    listed = {"apiVersion": "v1", "kind": "List", "items": [jobset]}
    assert len(check_pods_unprivileged(CONFIG_GROUP, {"yaml": yaml.safe_dump(listed)})) == 1


def test_pod_and_cronjob_templates_are_checked():
    pod_spec = {"containers": [{"name": "c", "image": OUR_IMAGE, "securityContext": {"privileged": True}}]}
    assert len(check_pods_unprivileged("kubernetes:core/v1:Pod", {"metadata": {"name": "p"}, "spec": pod_spec})) == 1
    cronjob = {"spec": {"jobTemplate": {"spec": {"template": {"spec": pod_spec}}}}}
    assert len(check_pods_unprivileged("kubernetes:batch/v1:CronJob", cronjob)) == 1


def graph(entries: list[dict]) -> list[Resource]:
    return [Resource(e["type"], e["name"], e["inputs"]) for e in entries]


def test_images_from_the_stack_repository_pass(compliant_graph):
    assert check_images_from_stack_registry(graph(compliant_graph)) == []


@pytest.mark.parametrize(
    "image",
    [
        "docker.io/library/python:3.12",
        "python:3.12",
        "us-east5-docker.pkg.dev/other-project/gemma-tpu-dev/trainer:abc123",
        "us-east5-docker.pkg.dev/my-project/gemma-tpu-dev-evil/trainer:abc123",
        "europe-west4-docker.pkg.dev/my-project/gemma-tpu-dev/trainer:abc123",
    ],
)
def test_an_image_from_elsewhere_is_reported_on_its_resource(compliant_graph, image):
    job = next(e for e in compliant_graph if e["name"] == "prepare")
    job["inputs"]["spec"]["template"]["spec"]["containers"][0]["image"] = image
    [violation] = check_images_from_stack_registry(graph(compliant_graph))
    assert violation.resource.name == "prepare"
    assert image in violation.message and "us-east5-docker.pkg.dev/my-project/gemma-tpu-dev/" in violation.message


def test_init_containers_of_a_jobset_are_checked(compliant_graph):
    jobset = next(e for e in compliant_graph if e["name"] == "train")
    jobset_pod(jobset["inputs"])["initContainers"] = [{"name": "fetch", "image": "busybox"}]
    [violation] = check_images_from_stack_registry(graph(compliant_graph))
    assert "'fetch'" in violation.message


def test_without_a_repository_in_the_stack_every_workload_image_is_reported(compliant_graph):
    without_registry = [e for e in compliant_graph if e["type"] != "gcp:artifactregistry/repository:Repository"]
    violations = check_images_from_stack_registry(graph(without_registry))
    assert {v.resource.name for v in violations} == {"prepare", "train"}
    assert all("declares no Docker repository" in v.message for v in violations)


def test_controllers_are_not_training_workloads():
    deployment = Resource(
        "kubernetes:apps/v1:Deployment",
        "jobset-controller",
        {"spec": {"template": {"spec": {"containers": [{"name": "m", "image": "registry.k8s.io/jobset/jobset:v0.12.0"}]}}}},
    )
    assert check_images_from_stack_registry([deployment]) == []


def test_the_stack_pushes_its_builds_to_its_own_repository(compliant_graph):
    build = {"type": "docker-build:index:Image", "name": "trainer", "parent": None,
             "inputs": {"push": True, "tags": [OUR_IMAGE]}}
    assert check_images_from_stack_registry(graph([*compliant_graph, build])) == []
    build["inputs"]["tags"] = ["docker.io/someone/trainer:latest"]
    [violation] = check_images_from_stack_registry(graph([*compliant_graph, build]))
    assert violation.resource.name == "trainer" and "docker.io/someone/trainer:latest" in violation.message
    build["inputs"]["push"] = False  # a local build goes nowhere
    assert check_images_from_stack_registry(graph([*compliant_graph, build])) == []


def test_a_repository_without_its_own_project_lives_in_the_providers(compliant_graph):
    repository = next(e for e in compliant_graph if e["type"] == "gcp:artifactregistry/repository:Repository")
    del repository["inputs"]["project"]
    assert len(check_images_from_stack_registry(graph(compliant_graph))) == 2
    provider = {"type": "pulumi:providers:gcp", "name": "gcp", "parent": None, "inputs": {"project": "my-project"}}
    assert check_images_from_stack_registry(graph([*compliant_graph, provider])) == []
