"""Workloads and infrastructure derive from the same stack config: the pods land on the node pools
infra creates, as the ServiceAccount infra creates, reading the buckets infra creates, also after
the topology or slice count of a stack changes."""

import pytest

from infra.catalog import tpu
from infra.cloud.checkpointing import INSTANCE_TYPE_LABEL, checkpoint_configurations
from infra.config import parse_stack_config
from infra.config.serving import SERVING_POOL
from infra.preview import preview
from tests.workloads.conftest import IMAGE, STACKS, container, spec_of, stack_values, training_pod
from workloads import manifests
from workloads.serving import stack_serving_objects
from workloads.spec import run_specs

TPU_MACHINE_TYPES = {s.machine_type for s in tpu.catalog()}


def _inputs_by_type(resources, type_):
    return [r.inputs for r in resources if r.type == type_]


def _by_name(objects):
    by_name = {obj["metadata"]["name"]: obj for obj in objects}
    assert len(by_name) == len(objects)
    return by_name


def _check_consistent(values, stack):
    config = parse_stack_config(values, stack)
    resources = preview(values, stack).resources
    spec = spec_of(config)
    run = manifests.training(spec)
    pod = training_pod(run)
    selector = pod["spec"]["nodeSelector"]
    chips = int(container(pod, manifests.TRAINER_CONTAINER)["resources"]["limits"]["google.com/tpu"])
    replicas = 1 if run["kind"] == "Job" else run["spec"]["replicatedJobs"][0]["replicas"]
    pods_per_slice = 1 if run["kind"] == "Job" else run["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"]

    pools = [p for p in _inputs_by_type(resources, "gcp:container/nodePool:NodePool")
             if p["nodeConfig"]["machineType"] in TPU_MACHINE_TYPES and p["name"] != SERVING_POOL]  # serving: tests/infra/test_serving.py
    if config.cluster_mode == "autopilot":
        assert pools == []  # GKE provisions from the pods' selectors alone
    else:
        assert len(pools) == config.tpu.slices >= replicas  # a run of gemma-tpu:runs may take fewer slices
        for pool in pools:
            assert pool["autoscaling"]["totalMaxNodeCount"] == pods_per_slice
            assert pool["nodeConfig"]["machineType"].endswith(f"-{chips}t")
            if pods_per_slice > 1:  # a multi-host slice: the pool is one compact block of that topology
                assert pool["placementPolicy"]["tpuTopology"] == selector["cloud.google.com/gke-tpu-topology"]
            else:
                assert "placementPolicy" not in pool
            assert bool(pool["nodeConfig"].get("spot")) == ("cloud.google.com/gke-spot" in selector)
            reserved = pool["nodeConfig"].get("reservationAffinity", {}).get("values")
            assert reserved == ([config.tpu.reservation] if config.tpu.capacity == "reservation" else None)
        if "affinity" in pod["spec"]:  # pods bound to named pools: exactly the pools infra creates
            (term,) = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            (expression,) = term["matchExpressions"]
            assert sorted(expression["values"]) == sorted(pool["name"] for pool in pools)
    assert (pods_per_slice * chips) == config.slice.chips

    (namespace,) = _inputs_by_type(resources, "kubernetes:core/v1:Namespace")
    accounts = _inputs_by_type(resources, "kubernetes:core/v1:ServiceAccount")
    assert manifests.namespace(spec) == namespace
    serving_accounts = [obj for obj in stack_serving_objects(config, run_specs(config, image=IMAGE), None) if obj["kind"] == "ServiceAccount"]
    assert _by_name(manifests.service_accounts(spec) + serving_accounts) == _by_name(accounts)
    # GKE's multi-tier checkpointing: infra applies the CheckpointConfiguration the render shows, its bucket
    # exists, and it serves the nodes of the pools the pods run on.
    configurations = checkpoint_configurations(config)
    assert _inputs_by_type(resources, "kubernetes:checkpointing.gke.io/v1:CheckpointConfiguration") == configurations
    for configuration in configurations:
        assert configuration["spec"]["nodeSelector"].items() <= selector.items()
        assert {pool["nodeConfig"]["machineType"] for pool in pools} == {configuration["spec"]["nodeSelector"][INSTANCE_TYPE_LABEL]}
    buckets = {b["name"] for b in _inputs_by_type(resources, "gcp:storage/bucket:Bucket")}
    assert {spec.data_bucket, spec.artifacts_bucket, *(c["spec"]["cloudStorageBucketName"] for c in configurations)} == buckets


@pytest.mark.parametrize("stack", STACKS)
def test_each_shipped_stack_runs_on_what_infra_creates(stack):
    _check_consistent(stack_values(stack), stack)


@pytest.mark.parametrize(
    ("stack", "tpu_changes"),
    [
        ("multislice", {"slices": 4}),
        ("multihost", {"topology": "4x4"}),
        ("dev", {"topology": "2x2", "capacity": "spot"}),
        ("multihost", {"capacity": "reservation", "reservation": "my-tpus"}),
        ("multislice", {"capacity": "reservation", "reservation": "projects/team-project/reservations/shared-v6e"}),
    ],
)
def test_changing_topology_or_slices_moves_pools_and_workloads_together(stack, tpu_changes):
    values = stack_values(stack)
    values["gemma-tpu:tpu"] = {**values["gemma-tpu:tpu"], **tpu_changes}
    _check_consistent(values, stack)
