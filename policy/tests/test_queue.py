"""The queue rules on small graphs: a queued stack's TPU workloads name its LocalQueue, and a
ClusterQueue's TPU quota fits in the stack's TPU pools."""

import copy

import pytest

from rules.base import Resource
from rules.queue import check_quota_within_capacity, check_workloads_queued

KUEUE = "kueue.x-k8s.io/v1beta2"
LOCAL_QUEUE = {"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": "tpu", "namespace": "training"},
               "spec": {"clusterQueue": "gemma-queued"}}  # fmt: skip


def cluster_queue(chips: int) -> dict:
    flavor = {"name": "v6e-2x4", "resources": [{"name": "google.com/tpu", "nominalQuota": chips}, {"name": "ephemeral-storage", "nominalQuota": "92Gi"}]}
    return {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": "gemma-queued"},
            "spec": {"resourceGroups": [{"coveredResources": ["google.com/tpu", "ephemeral-storage"], "flavors": [flavor]}]}}  # fmt: skip


def pool(name: str, machine: str = "ct6e-standard-4t", hosts: int = 2) -> Resource:
    return Resource("gcp:container/nodePool:NodePool", name, {"nodeConfig": {"machineType": machine}, "autoscaling": {"totalMaxNodeCount": hosts}})


def jobset(name: str, labels: dict) -> Resource:
    pod = {"containers": [{"name": "trainer", "resources": {"requests": {"google.com/tpu": "4"}, "limits": {"google.com/tpu": "4"}}}]}
    props = {"metadata": {"name": name, "namespace": "training", "labels": labels},
             "spec": {"replicatedJobs": [{"name": "slice", "template": {"spec": {"template": {"spec": pod}}}}]}}  # fmt: skip
    return Resource("kubernetes:jobset.x-k8s.io/v1alpha2:JobSet", "training", props)


PREPARE = Resource("kubernetes:batch/v1:Job", "prepare-data", {
    "metadata": {"name": "prepare-data-1", "namespace": "training"},
    "spec": {"template": {"spec": {"containers": [{"name": "prepare", "resources": {"requests": {"cpu": "2"}}}]}}},
})  # fmt: skip


def queued_stack(*workloads: Resource, chips: int = 16) -> list[Resource]:
    group = Resource("kubernetes:yaml/v2:ConfigGroup", "queue", {"objs": [cluster_queue(chips), LOCAL_QUEUE]})
    return [pool("cpu", machine="e2-standard-4", hosts=3), pool("tpu-slice-0"), pool("tpu-slice-1"), group, PREPARE, *workloads]


def test_a_queued_stack_passes():
    stack = queued_stack(jobset("a", {"kueue.x-k8s.io/queue-name": "tpu"}), jobset("b", {"kueue.x-k8s.io/queue-name": "tpu"}))
    assert check_workloads_queued(stack) == [] and check_quota_within_capacity(stack) == []


@pytest.mark.parametrize("labels", [{}, {"kueue.x-k8s.io/queue-name": "elsewhere"}])
def test_a_tpu_workload_outside_the_queue_is_reported(labels):
    bypass = jobset("bypass", labels)
    stack = queued_stack(jobset("a", {"kueue.x-k8s.io/queue-name": "tpu"}), bypass)
    [violation] = check_workloads_queued(stack)
    assert violation.resource == bypass and "JobSet bypass" in violation.message and "training/tpu" in violation.message


def test_a_workload_in_another_namespace_is_not_in_the_queue():
    elsewhere = copy.deepcopy(jobset("a", {"kueue.x-k8s.io/queue-name": "tpu"}))
    elsewhere.props["metadata"]["namespace"] = "other"
    assert len(check_workloads_queued(queued_stack(elsewhere))) == 1


def test_a_stack_without_a_queue_is_not_judged():
    assert check_workloads_queued([pool("tpu-slice-0"), jobset("a", {})]) == []


def test_a_quota_over_the_pools_is_reported():
    stack = queued_stack(chips=24)
    [violation] = check_quota_within_capacity(stack)
    assert "admits 24 google.com/tpu chips" in violation.message and "hold 16" in violation.message
    # One pool fewer: the same quota of 16 is now over capacity too.
    assert len(check_quota_within_capacity([r for r in queued_stack(chips=16) if r.name != "tpu-slice-1"])) == 1


def test_autopilot_has_no_pools_to_judge_the_quota_by():
    autopilot = Resource("gcp:container/cluster:Cluster", "gemma-a", {"enableAutopilot": True})
    group = Resource("kubernetes:yaml/v2:ConfigGroup", "queue", {"objs": [cluster_queue(64)]})
    assert check_quota_within_capacity([autopilot, group]) == []
