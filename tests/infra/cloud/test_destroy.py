"""What `pulumi destroy` does with each shipped stack, read from the preview graph: nothing refuses
deletion unless `protect: true`, buckets go or stay as configured, Kubernetes objects are deleted
while the cluster and its node pools still run them, and a vanished cluster does not block destroy."""

import pytest

from infra.config import parse_stack_config
from infra.config.serving import SERVING_POOL

from infra.config.stack_files import read_stack_values
from infra.preview import Resource, preview
from tests.infra.conftest import SHIPPED_STACKS, STANDARD_STACKS, of_type, one, previewed, stack_values

CLUSTER = "gcp:container/cluster:Cluster"
BUCKET = "gcp:storage/bucket:Bucket"
REGISTRY = "gcp:artifactregistry/repository:Repository"
NODE_POOL = "gcp:container/nodePool:NodePool"
# The shipped stacks' choice (docs/stacks.md): a dev stack's checkpoints go with it, the others' stay.
KEEPS_ARTIFACTS = {"dev": False, "multihost": True, "multislice": True, "autopilot": True, "queued": True, "serving": True}


def prerequisites(resources: list[Resource], resource: Resource) -> set[tuple[str, str]]:
    """(type, name) of everything `resource` waits for, directly or not, its provider included:
    Pulumi deletes a resource before any of these."""
    by_urn = {r.urn: r for r in resources}
    providers = {r.name: r.urn for r in resources if r.type.startswith("pulumi:providers:")}

    def direct(r: Resource) -> list[str]:
        return [*r.dependency_urns, *([providers[r.provider]] if r.provider else [])]

    seen: set[str] = set()
    pending = direct(resource)
    while pending:
        urn = pending.pop()
        if urn not in seen:
            seen.add(urn)
            pending += direct(by_urn[urn])
    return {(by_urn[urn].type, by_urn[urn].name) for urn in seen}


def buckets(resources: list[Resource]) -> dict[str, Resource]:
    return {b.name.removesuffix("-bucket"): b for b in of_type(resources, BUCKET)}


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_each_shipped_stack_file_states_what_destroy_keeps(stack):
    """A user copying a stack file sees both choices, not only their defaults."""
    values, _ = read_stack_values(stack)
    assert values["gemma-tpu:protect"] is False
    assert values["gemma-tpu:storage"]["keepArtifacts"] is KEEPS_ARTIFACTS[stack]


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_nothing_refuses_deletion_in_a_shipped_stack(stack):
    resources = previewed(stack).resources
    assert [r.name for r in resources if r.protect] == []
    assert one(resources, CLUSTER).inputs["deletionProtection"] is False


@pytest.mark.parametrize("stack", ["dev", "autopilot"])
def test_protect_true_guards_the_cluster_buckets_and_registry(stack):
    resources = preview(stack_values(stack, **{"gemma-tpu:protect": True}), stack).resources
    assert sorted((r.type, r.name) for r in resources if r.protect) == sorted(
        [(CLUSTER, f"gemma-{stack}"), (BUCKET, "artifacts-bucket"), (BUCKET, "data-bucket"), (REGISTRY, "trainer-images")]
    )
    assert one(resources, CLUSTER).inputs["deletionProtection"] is True


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_destroy_deletes_the_data_bucket_and_keeps_artifacts_outside_dev(stack):
    by_role = buckets(previewed(stack).resources)
    data, artifacts = by_role["data"], by_role["artifacts"]
    assert (data.retain_on_delete, data.inputs["forceDestroy"]) == (False, True)  # deleted, objects and all
    keep = KEEPS_ARTIFACTS[stack]
    assert artifacts.retain_on_delete is keep
    assert artifacts.inputs["forceDestroy"] is not keep  # a kept bucket is never emptied


def test_force_destroy_false_makes_destroy_leave_non_empty_buckets_alone():
    values = stack_values("dev", **{"gemma-tpu:storage": {"forceDestroy": False, "keepArtifacts": False}})
    assert {role: b.inputs["forceDestroy"] for role, b in buckets(preview(values, "dev").resources).items()} == {
        "data": False,
        "artifacts": False,
    }


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_kubernetes_objects_are_deleted_before_the_cluster_and_its_node_pools(stack):
    resources = previewed(stack).resources
    cluster = (CLUSTER, f"gemma-{stack}")
    node_pools = {(NODE_POOL, p.inputs["name"]) for p in of_type(resources, NODE_POOL)}
    cpu_pool = {pool for pool in node_pools if pool[1] == "cpu"}
    assert bool(cpu_pool) is (stack in STANDARD_STACKS)
    kubernetes = [r for r in resources if r.type.startswith("kubernetes:")]
    assert {r.type for r in kubernetes} >= {"kubernetes:core/v1:Namespace", "kubernetes:yaml/v2:ConfigFile"}
    for resource in kubernetes:
        # The controllers on the CPU pool (JobSet's, the namespace's finalizers) still run while it goes.
        assert {cluster, *cpu_pool} <= prerequisites(resources, resource), resource.name
    # The training pods (a Job or a JobSet, of each run) leave the TPU hosts before their pools go.
    runs = [r for r in kubernetes if r.name == "training"]
    assert len(runs) == len(parse_stack_config(stack_values(stack), stack).runs)
    for training in runs:  # the serving pool's pods: tests/infra/test_serving.py
        assert node_pools - cpu_pool - {(NODE_POOL, SERVING_POOL)} <= prerequisites(resources, training)


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_kubernetes_provider_drops_objects_of_a_cluster_that_is_gone(stack):
    provider = one(previewed(stack).resources, "pulumi:providers:kubernetes", "gke")
    assert provider.inputs["deleteUnreachable"] == "true"
