"""The serving rules on the shipped serving stack's preview graph: it passes, and each rule catches
what it is for (an unpinned or foreign image, a writable model mount, a public Service)."""

import copy

import pytest

from check import check_graph
from rules.base import Resource
from rules.serving import (
    PUBLIC_ANNOTATION,
    check_model_mounts_read_only,
    check_server_images_pinned,
    check_services_not_public,
)
from test_stack_graphs import shipped_graph

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
SERVICE = "kubernetes:core/v1:Service"


@pytest.fixture
def graph() -> list[dict]:
    return copy.deepcopy(list(shipped_graph("serving")))


def entry(graph: list[dict], type_: str) -> dict:
    (found,) = [e for e in graph if e["type"] == type_ and e["name"] == "vllm"]
    return found


def resources(graph: list[dict]) -> list[Resource]:
    return [Resource(e["type"], e["name"], e["inputs"]) for e in graph]


def server_pod(graph: list[dict]) -> dict:
    return entry(graph, DEPLOYMENT)["inputs"]["spec"]["template"]["spec"]


def test_the_serving_stack_is_judged_and_passes(graph):
    assert {DEPLOYMENT, SERVICE, "kubernetes:monitoring.googleapis.com/v1:PodMonitoring"} <= {e["type"] for e in graph}
    assert check_server_images_pinned(resources(graph)) == []
    for e in graph:
        assert check_model_mounts_read_only(e["type"], e["inputs"]) == check_services_not_public(e["type"], e["inputs"]) == []


def test_an_unpinned_image_is_caught_by_the_pack(graph):
    container = server_pod(graph)["containers"][0]
    container["image"] = container["image"].split("@")[0] + ":latest"
    violations = check_graph(graph).violations
    assert any(v.startswith("[serving-images-pinned]") and "not pinned by digest" in v for v in violations), violations


def test_a_pinned_image_from_elsewhere_is_caught(graph):
    server_pod(graph)["containers"][0]["image"] = "docker.io/vllm/vllm-tpu@sha256:" + "e" * 64
    (violation,) = check_server_images_pinned(resources(graph))
    assert "not in the stack's Artifact Registry" in violation.message and violation.resource.name == "vllm"


def test_a_writable_model_mount_is_caught(graph):
    pod = server_pod(graph)
    (volume,) = [v for v in pod["volumes"] if "csi" in v]
    volume["csi"]["readOnly"] = False
    pod["containers"][0]["volumeMounts"][0]["readOnly"] = False
    problems = check_model_mounts_read_only(DEPLOYMENT, entry(graph, DEPLOYMENT)["inputs"])
    assert len(problems) == 2 and all("'model'" in p for p in problems)


@pytest.mark.parametrize(
    ("service_type", "annotations", "ranges", "caught"),
    [
        ("LoadBalancer", {}, ["203.0.113.0/24"], "keep it ClusterIP"),
        ("NodePort", {}, [], "keep it ClusterIP"),
        ("LoadBalancer", {PUBLIC_ANNOTATION: "true"}, [], "loadBalancerSourceRanges"),
        ("LoadBalancer", {PUBLIC_ANNOTATION: "true"}, ["0.0.0.0/0"], "loadBalancerSourceRanges"),
        ("LoadBalancer", {PUBLIC_ANNOTATION: "true"}, ["203.0.113.0/24"], None),
    ],
)  # fmt: skip
def test_a_public_service_needs_the_annotation_and_client_ranges(graph, service_type, annotations, ranges, caught):
    service = entry(graph, SERVICE)["inputs"]
    service["spec"]["type"] = service_type
    service["metadata"]["annotations"] = {**service["metadata"].get("annotations", {}), **annotations}
    if ranges:
        service["spec"]["loadBalancerSourceRanges"] = ranges
    problems = check_services_not_public(SERVICE, service)
    assert (problems == []) if caught is None else (len(problems) == 1 and caught in problems[0])
    if caught:
        assert any(v.startswith("[serving-services-not-public]") for v in check_graph(graph).violations)
