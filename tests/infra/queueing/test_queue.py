"""Kueue in front of the TPUs (gemma-tpu:queue, gemma-tpu:runs), on the previewed stack graph: the
quota is what the pools hold, each run is its own queued object, and a change to one run touches
only that run's resources."""

import itertools

import pytest

from infra.catalog import tpu
from infra.config import parse_stack_config
from infra.queueing.kueue import KUEUE_MANIFESTS, KUEUE_VERSION
from infra.queueing.queues import (
    KUEUE_API_VERSION,
    LOCAL_QUEUE,
    PRIORITY_LABEL,
    PROVISIONING_CHECK,
    QUEUE_LABEL,
    TPU_RESOURCE,
    cluster_queue,
    queue_objects,
)
from infra.preview import preview
from tests.infra.conftest import PROJECT_ID, STANDARD_STACKS, of_type, one, previewed, stack_values

NODE_POOL = "gcp:container/nodePool:NodePool"
CONFIG_FILE = "kubernetes:yaml/v2:ConfigFile"
CONFIG_GROUP = "kubernetes:yaml/v2:ConfigGroup"
JOB = "kubernetes:batch/v1:Job"
JOBSET = "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet"
TRAINING_KINDS = (JOB, JOBSET)


def queued_values(stack: str, **overrides):
    values = stack_values(stack, **overrides)
    return {**values, "gemma-tpu:queue": {**(values.get("gemma-tpu:queue") or {}), "enabled": True}}


def queue_group(resources) -> dict[str, dict]:
    """The queue's objects by kind (the priority classes: by name)."""
    objects = one(resources, CONFIG_GROUP, "queue").inputs["objs"]
    return {obj["metadata"]["name"] if obj["kind"] == "WorkloadPriorityClass" else obj["kind"]: obj for obj in objects}


def pool_chips(resources) -> int:
    """google.com/tpu chips the TPU pools hold at their largest: max nodes x the machine's chips."""
    chips_per_machine = {s.machine_type: s.chips_per_host for s in tpu.catalog()}
    return sum(
        pool.inputs["autoscaling"]["totalMaxNodeCount"] * chips_per_machine[pool.inputs["nodeConfig"]["machineType"]]
        for pool in of_type(resources, NODE_POOL)
        if pool.parent == "tpu"
    )


def training_objects(resources):
    return [r for r in resources if r.type in TRAINING_KINDS and r.name == "training"]


@pytest.mark.parametrize("stack", STANDARD_STACKS)
def test_the_quota_is_the_pools_capacity(stack):
    resources = preview(queued_values(stack), stack).resources
    (flavor,) = cluster_queue_spec(resources)["resourceGroups"][0]["flavors"]
    quota = {r["name"]: r["nominalQuota"] for r in flavor["resources"]}
    assert quota[TPU_RESOURCE] == pool_chips(resources) > 0


def cluster_queue_spec(resources) -> dict:
    return queue_group(resources)["ClusterQueue"]["spec"]


@pytest.mark.parametrize(
    ("spec", "slices"),
    [(s, n) for s in tpu.catalog() for n in ((1, 2) if s.multi_host else (1,))],
    ids=lambda value: getattr(value, "accelerator", None) and f"{value.accelerator}-{value.topology}",
)
def test_the_quota_of_generated_topologies_is_chips_times_the_pools_hosts(spec, slices):
    config = parse_stack_config(
        {"gcp:project": PROJECT_ID, "gemma-tpu:tpu": {"accelerator": spec.accelerator, "topology": spec.topology, "slices": slices},
         "gemma-tpu:queue": {"enabled": True}},
        "generated",
    )  # fmt: skip
    (flavor,) = cluster_queue(config)["spec"]["resourceGroups"][0]["flavors"]
    assert flavor["resources"][0] == {"name": TPU_RESOURCE, "nominalQuota": spec.chips_per_host * spec.hosts * slices}
    # The flavor's labels are the ones the pools' nodes carry and the training pods select.
    assert queue_objects(config)[0]["spec"]["nodeLabels"] == spec.node_selector


def test_kueue_comes_after_jobset_and_the_queue_after_kueue_and_the_runs_after_the_queue():
    resources = previewed("queued").resources
    install = one(resources, CONFIG_FILE, "kueue")
    assert install.inputs["file"] == KUEUE_MANIFESTS
    assert "jobset" in install.depends_on and "cpu" in install.depends_on
    group = one(resources, CONFIG_GROUP, "queue")
    assert install.urn in group.dependency_urns
    for run in training_objects(resources):
        assert group.urn in run.dependency_urns, run.name


def test_a_stack_without_the_queue_has_no_kueue_and_its_runs_are_not_queued():
    resources = previewed("multislice").resources
    assert not of_type(resources, CONFIG_GROUP) and not [r for r in of_type(resources, CONFIG_FILE) if r.name == "kueue"]
    (run,) = training_objects(resources)
    assert QUEUE_LABEL not in run.inputs["metadata"]["labels"] and "suspend" not in run.inputs["spec"]


def test_each_run_of_the_list_is_its_own_suspended_workload_in_the_local_queue():
    resources = previewed("queued").resources
    queue = queue_group(resources)
    runs = training_objects(resources)
    assert sorted(r.parent for r in runs) == ["run-chat-sft", "run-sweep-lr-1e-5", "run-sweep-lr-3e-5"]
    names = {r.inputs["metadata"]["name"] for r in runs}
    assert len(names) == 3
    directories = {arg for r in runs for arg in _trainer_args(r) if arg.startswith("/artifacts/runs/") and "/" not in arg.removeprefix("/artifacts/runs/")}
    assert len(directories) == 3
    assert queue["LocalQueue"]["metadata"] == {"name": LOCAL_QUEUE, "namespace": "training"}
    assert queue["LocalQueue"]["spec"]["clusterQueue"] == queue["ClusterQueue"]["metadata"]["name"]
    assert queue["ClusterQueue"]["spec"]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "training"}}
    for run in runs:
        labels = run.inputs["metadata"]["labels"]
        # Kueue's webhook creates it suspended; the stack leaves spec.suspend to Kueue.
        assert labels[QUEUE_LABEL] == LOCAL_QUEUE and "suspend" not in run.inputs["spec"]
        assert labels[PRIORITY_LABEL] in queue, "a priority class the stack creates"
    by_run = {r.parent: r.inputs["metadata"]["labels"][PRIORITY_LABEL] for r in runs}
    value = {name: obj["value"] for name, obj in queue.items() if obj["kind"] == "WorkloadPriorityClass"}
    assert value[by_run["run-chat-sft"]] > value[by_run["run-sweep-lr-1e-5"]] == value[by_run["run-sweep-lr-3e-5"]]


def _trainer_args(run) -> list[str]:
    spec = run.inputs["spec"]
    template = spec["replicatedJobs"][0]["template"]["spec"]["template"] if "replicatedJobs" in spec else spec["template"]
    return template["spec"]["containers"][0]["args"]


def test_runs_of_one_dataset_share_its_preparation():
    resources = previewed("queued").resources
    preparations = {r.parent: r.inputs["metadata"]["name"] for r in of_type(resources, JOB) if r.name == "prepare-data"}
    assert len(preparations) == 2, "chat data and TinyStories"
    assert all(parent.startswith("data-") for parent in preparations)


def _by_urn(resources):
    """Inputs by (parent, type, name): a URN names the parent's type, not the parent."""
    return {(r.parent, r.type, r.name): r.inputs for r in resources}


def _runs_edited(edit):
    values = stack_values("queued")
    runs = [dict(run) for run in values["gemma-tpu:runs"]]
    values["gemma-tpu:runs"] = edit(runs)
    return _by_urn(preview(values, "queued").resources)


def test_changing_one_run_changes_only_that_runs_object():
    before = _by_urn(previewed("queued").resources)
    after = _runs_edited(lambda runs: [*runs[:2], {**runs[2], "learningRate": 0.0001}])
    assert before.keys() == after.keys()
    changed = [urn for urn in before if before[urn] != after[urn]]
    assert changed == [("run-sweep-lr-3e-5", JOBSET, "training")]


def test_changing_a_runs_priority_changes_only_its_priority_label():
    """The same object (its name does not hold the priority: no new run, no replacement), its
    priority label changed, which Kueue's webhook accepts on a running workload; and the object
    holds no spec.suspend, which Kueue writes once it admits the run, so the server-side apply of
    the change meets no conflict (tests/workloads/admission.py, kueue-queued-objects)."""
    before = _by_urn(previewed("queued").resources)
    after = _runs_edited(lambda runs: [{**runs[0], "priority": "low"}, *runs[1:]])
    changed = [urn for urn in before if before[urn] != after[urn]]
    assert changed == [("run-chat-sft", JOBSET, "training")]
    old, new = before[changed[0]], after[changed[0]]
    assert new["metadata"]["labels"] == {**old["metadata"]["labels"], PRIORITY_LABEL: "gemma-tpu-low"}
    assert {**new, "metadata": None} == {**old, "metadata": None} and "suspend" not in new["spec"]


def test_adding_a_run_adds_only_its_resources_and_removing_one_removes_only_it():
    before = _by_urn(previewed("queued").resources)
    added = _runs_edited(lambda runs: [*runs, {"name": "sweep-lr-1e-4", "priority": "low", "slices": 1, "learningRate": 0.0001}])
    assert set(before) < set(added)
    # Nothing of the other runs changes; the log-based metrics' filters name the runs, so they do.
    changed = {key for key, inputs in before.items() if added[key] != inputs}
    assert changed and all(key[0] == "monitoring" and key[1] == "gcp:logging/metric:Metric" for key in changed)
    new = set(added) - set(before)
    assert new == {(None, "gemma-tpu:workloads:TrainingRun", "run-sweep-lr-1e-4"), ("run-sweep-lr-1e-4", JOBSET, "training")}
    removed = _runs_edited(lambda runs: runs[1:])
    assert set(removed) < set(before)
    assert all(removed[key] == before[key] for key in removed if key[0] != "monitoring")
    # Gone: chat-sft (its component and JobSet) and the preparation of the chat data, which no run
    # trains on any more (its component and Job).
    gone = set(before) - set(removed)
    (chat_data,) = {key[2] for key in gone if key[2].startswith("data-")}
    assert gone == {(None, "gemma-tpu:workloads:TrainingRun", "run-chat-sft"), ("run-chat-sft", JOBSET, "training"),
                    (None, "gemma-tpu:workloads:DataPreparation", chat_data), (chat_data, JOB, "prepare-data")}  # fmt: skip


def test_flex_start_behind_the_queue_is_queued_provisioning():
    resources = previewed("queued").resources
    queue = queue_group(resources)
    for pool in (r for r in of_type(resources, NODE_POOL) if r.parent == "tpu"):
        assert pool.inputs["queuedProvisioning"] == {"enabled": True}
        assert pool.inputs["nodeConfig"]["flexStart"] is True
        assert pool.inputs["nodeConfig"]["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
        assert pool.inputs["autoscaling"]["totalMinNodeCount"] == 0 and pool.inputs["autoscaling"]["locationPolicy"] == "ANY"
        assert pool.inputs["management"]["autoRepair"] is False
    check = queue["AdmissionCheck"]
    assert queue["ClusterQueue"]["spec"]["admissionChecksStrategy"] == {"admissionChecks": [{"name": check["metadata"]["name"]}]}
    assert check["spec"]["parameters"]["name"] == queue["ProvisioningRequestConfig"]["metadata"]["name"] == PROVISIONING_CHECK
    assert queue["ProvisioningRequestConfig"]["spec"] == {
        "provisioningClassName": "queued-provisioning.gke.io", "managedResources": [TPU_RESOURCE], "parameters": {"tpu-topology": "2x4"}}


# The taints of a queued provisioning TPU pool's nodes (GKE: every TPU node; queued provisioning's own).
QUEUED_TPU_NODE_TAINTS = [
    {"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"},
    {"key": "cloud.google.com/gke-queued", "value": "true", "effect": "NoSchedule"},
]


def tolerates(tolerations: list[dict], taint: dict) -> bool:
    """Kubernetes' ToleratesTaint: same effect (or none), same key (or none with Exists), and
    Exists or an Equal value."""
    return any(
        t.get("effect", taint["effect"]) == taint["effect"]
        and t.get("key", taint["key"]) == taint["key"]
        and (t.get("operator", "Equal") == "Exists" or t.get("value") == taint["value"])
        for t in tolerations
    )


def test_the_provisioning_request_can_land_on_the_queued_tpu_nodes():
    """Kueue builds the ProvisioningRequest's PodTemplate from the run's pod set and the flavor; GKE's
    automatic google.com/tpu toleration applies to Pods, not to that template, so the flavor must
    tolerate every taint of the nodes GKE is asked for (it once tolerated only gke-queued)."""
    flavor = queue_group(previewed("queued").resources)["ResourceFlavor"]
    for taint in QUEUED_TPU_NODE_TAINTS:
        assert tolerates(flavor["spec"].get("tolerations", []), taint), taint
    assert not tolerates([{"key": "cloud.google.com/gke-queued", "operator": "Exists", "effect": "NoSchedule"}],
                         QUEUED_TPU_NODE_TAINTS[0]), "the flavor as it was"  # fmt: skip


def test_queued_runs_bound_how_long_gke_keeps_their_flex_start_nodes():
    """Kueue passes provreq.kueue.x-k8s.io/* annotations to the ProvisioningRequest; GKE keeps
    flex-start nodes at most 7 days."""
    for run in training_objects(previewed("queued").resources):
        seconds = run.inputs["metadata"]["annotations"]["provreq.kueue.x-k8s.io/maxRunDurationSeconds"]
        assert seconds == str(7 * 24 * 3600), run.name
    for run in training_objects(preview(queued_values("multislice"), "multislice").resources):
        assert "provreq.kueue.x-k8s.io/maxRunDurationSeconds" not in run.inputs["metadata"].get("annotations", {})


def test_every_job_in_the_namespace_waits_for_kueue_to_serve_its_webhooks():
    """Kueue's Job and Pod webhooks (failurePolicy Fail) refuse every Job of the namespace while its
    controller is not Ready; pulumi-kubernetes does not retry that refusal. So the preparation Jobs
    come after Kueue's install (and `pulumi destroy` deletes them before it), not only the runs."""
    resources = previewed("queued").resources
    install = one(resources, CONFIG_FILE, "kueue")
    jobs = [r for r in of_type(resources, JOB) if r.name == "prepare-data"] + training_objects(resources)
    assert len(jobs) == 5
    for job in jobs:
        assert install.urn in job.dependency_urns, (job.parent, job.name)


def test_a_multi_host_slice_is_asked_for_as_its_pool_is_placed():
    """Google's TPU v6e queued-provisioning example: the pool COMPACT-placed with the slice's
    topology, its hosts as the pool's maximum, and the request's tpu-topology the same topology."""
    resources = previewed("queued").resources
    parameters = queue_group(resources)["ProvisioningRequestConfig"]["spec"]["parameters"]
    for pool in (r for r in of_type(resources, NODE_POOL) if r.parent == "tpu"):
        assert pool.inputs["placementPolicy"] == {"type": "COMPACT", "tpuTopology": parameters["tpu-topology"]}
        assert pool.inputs["autoscaling"]["totalMaxNodeCount"] == tpu.slice_spec("v6e", parameters["tpu-topology"]).hosts


def test_with_queued_provisioning_kueue_starts_after_the_pools():
    """Kueue looks for the ProvisioningRequest API once, at start-up."""
    resources = previewed("queued").resources
    install = one(resources, CONFIG_FILE, "kueue")
    pools = [r for r in of_type(resources, NODE_POOL) if r.parent == "tpu"]
    assert pools and all(pool.urn in install.dependency_urns for pool in pools)


def test_flex_start_without_the_queue_keeps_plain_flex_start_pools():
    values = stack_values("multihost", **{"gemma-tpu:tpu": {"topology": "2x4", "capacity": "flex-start"}})
    resources = preview(values, "multihost").resources
    (pool,) = (r for r in of_type(resources, NODE_POOL) if r.parent == "tpu")
    assert "queuedProvisioning" not in pool.inputs
    assert not of_type(resources, CONFIG_GROUP)


def test_every_resource_the_training_pods_request_is_covered_by_the_queue():
    """Kueue leaves a workload pending ("resource X unavailable in ClusterQueue") otherwise."""
    resources = previewed("queued").resources
    covered = cluster_queue_spec(resources)["resourceGroups"][0]["coveredResources"]
    for run in training_objects(resources):
        spec = run.inputs["spec"]
        pod = spec["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        requested = {name for c in itertools.chain(pod["containers"], pod.get("initContainers", []))
                     for name in c.get("resources", {}).get("requests", {})}  # fmt: skip
        assert requested <= set(covered), run.name


def test_autopilot_queues_the_chips_the_stack_is_sized_for():
    """No pools there: GKE makes a node per pod, so the quota is the stack's slices."""
    values = queued_values("autopilot")
    config = parse_stack_config(values, "autopilot")
    (flavor,) = cluster_queue_spec(preview(values, "autopilot").resources)["resourceGroups"][0]["flavors"]
    assert flavor["resources"][0] == {"name": TPU_RESOURCE, "nominalQuota": config.slice.chips * config.tpu.slices}


def test_the_pinned_kueue_has_what_the_queue_needs():
    """v1beta2 (the objects' API), JobSet integration and waitForPodsReady on by default: v0.19 on."""
    major, minor, _ = (int(part) for part in KUEUE_VERSION.removeprefix("v").split("."))
    assert (major, minor) >= (0, 19)
    assert {obj["apiVersion"] for obj in queue_objects(parse_stack_config(queued_values("queued"), "queued"))} == {KUEUE_API_VERSION}
