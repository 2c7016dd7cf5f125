"""The multi-tier checkpointing rule on small graphs: a pod on GKE's multi-tier volume is served by the
cluster's addon and a CheckpointConfiguration that selects its nodes, in a JobSet of one replicated Job."""

import copy

import pytest

from rules.base import Resource
from rules.checkpointing import check_multi_tier_volumes_served

SELECTOR = {"node.kubernetes.io/instance-type": "ct6e-standard-4t"}
CLUSTER = Resource("gcp:container/cluster:Cluster", "gemma-multislice",
                   {"addonsConfig": {"highScaleCheckpointingConfig": {"enabled": True}}})
CONFIGURATION = Resource("kubernetes:checkpointing.gke.io/v1:CheckpointConfiguration", "gemma-multislice-ct6e-standard-4t", {
    "apiVersion": "checkpointing.gke.io/v1", "kind": "CheckpointConfiguration", "metadata": {"name": "gemma-multislice-ct6e-standard-4t"},
    "spec": {"cloudStorageBucketName": "p-multislice-mtc", "nodeSelector": SELECTOR, "inMemoryVolumeSize": "6Gi"}})  # fmt: skip


def jobset(*, selector=SELECTOR, replicated_jobs: int = 1, driver="multitier-checkpoint.csi.storage.gke.io") -> Resource:
    pod = {"nodeSelector": {"cloud.google.com/gke-tpu-topology": "2x4", **selector},
           "containers": [{"name": "trainer", "volumeMounts": [{"name": "local-checkpoints", "mountPath": "/local-checkpoints"}]}],
           "volumes": [{"name": "local-checkpoints", "csi": {"driver": driver}}]}  # fmt: skip
    jobs = [{"name": f"slice-{i}", "replicas": 2, "template": {"spec": {"parallelism": 2, "template": {"spec": copy.deepcopy(pod)}}}}
            for i in range(replicated_jobs)]
    return Resource("kubernetes:jobset.x-k8s.io/v1alpha2:JobSet", "training", {"metadata": {"name": "run"}, "spec": {"replicatedJobs": jobs}})


def test_a_served_volume_passes():
    assert check_multi_tier_volumes_served([CLUSTER, CONFIGURATION, jobset()]) == []


def test_pods_without_the_volume_need_nothing():
    assert check_multi_tier_volumes_served([jobset(driver="gcsfuse.csi.storage.gke.io", replicated_jobs=2)]) == []


@pytest.mark.parametrize("stack, found", [
    (lambda: [CONFIGURATION, jobset()], "enables addonsConfig.highScaleCheckpointingConfig"),
    (lambda: [Resource(CLUSTER.type, "c", {**CLUSTER.props, "enableAutopilot": True}), CONFIGURATION, jobset()],
     "enables addonsConfig.highScaleCheckpointingConfig"),
    (lambda: [CLUSTER, jobset()], "no CheckpointConfiguration selects"),
    (lambda: [CLUSTER, CONFIGURATION, jobset(selector={"node.kubernetes.io/instance-type": "ct6e-standard-8t"})],
     "no CheckpointConfiguration selects"),
    (lambda: [CLUSTER, CONFIGURATION, jobset(replicated_jobs=2)], "exactly one replicated Job"),
])
def test_an_unserved_volume_is_reported_on_the_workload(stack, found):
    resources = stack()
    violations = check_multi_tier_volumes_served(resources)
    assert [v.resource for v in violations] == [resources[-1]] * len(violations)
    assert any(found in v.message for v in violations), [v.message for v in violations]
