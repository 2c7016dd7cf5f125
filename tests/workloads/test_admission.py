"""Every rendered object of every shipped stack and of generated shapes passes what the real
admission path enforces beyond the schemas (tests/workloads/admission.py), and each of those
rules refuses an object that breaks it on purpose."""

import copy
import dataclasses
import itertools

import pytest

from infra.catalog import names, tpu
from infra.errors import ConfigError
from tests.workloads import admission, admission_serving
from tests.workloads.conftest import STACKS, edited_config, spec_of, stack_config, training_pod
from workloads import manifests
from workloads.__main__ import stack_objects


def _shapes():
    """(stack, tpu and cluster changes) over the catalog: every slice once, multi-host ones also
    as 2 and 16 slices, on each capacity and both cluster modes where config allows them."""
    for spec in tpu.catalog():
        for slices in (1, 2, 16) if spec.multi_host else (1,):
            yield spec, slices


def _generated_configs():
    for (spec, slices), (mode, capacity) in itertools.product(
        _shapes(), [("standard", "on-demand"), ("standard", "spot"), ("standard", "reservation"), ("standard", "flex-start"), ("autopilot", "spot")]
    ):
        if (spec.accelerator, spec.topology, slices, capacity) not in _SAMPLED and capacity != "on-demand":
            continue
        longest = "r" * names.run_name_max(slices=slices, hosts_per_slice=spec.hosts)
        tpu_keys = {"accelerator": spec.accelerator, "topology": spec.topology, "slices": slices, "capacity": capacity}
        if capacity == "reservation":
            tpu_keys["reservation"] = "projects/team-project/reservations/shared-v6e"
        # A /12 of pod ranges: 16 slices of 64 hosts are more nodes than the default /14 holds.
        yield f"{spec.accelerator}-{spec.topology}x{slices}-{mode}-{capacity}", edited_config(
            "dev", cluster={"mode": mode}, tpu=tpu_keys, training={"runName": longest, "batchSize": 16 * slices * spec.hosts},
            network={"podCidr": "10.16.0.0/12"},
        )


# Capacities other than on-demand on a few shapes (they change selectors and affinity only).
_SAMPLED = {("v6e", "1x1", 1), ("v6e", "2x4", 2), ("v5p", "4x4x4", 16)}
_SAMPLED = {(*shape, capacity) for shape in _SAMPLED for capacity in ("spot", "reservation", "flex-start")}
GENERATED = dict(_generated_configs())


def _objects(config):
    return stack_objects(config)


@pytest.mark.parametrize("stack", STACKS)
def test_every_object_of_every_shipped_stack_would_be_admitted(stack):
    for obj in _objects(stack_config(stack)):
        assert admission.violations(obj) == [], obj["metadata"]["name"]


@pytest.mark.parametrize("stack", STACKS)
def test_profiling_adds_a_port_that_would_be_admitted(stack):
    for obj in _objects(edited_config(stack, training={"profiling": True})):
        assert admission.violations(obj) == [], obj["metadata"]["name"]


@pytest.mark.parametrize("case", sorted(GENERATED))
def test_every_object_of_generated_shapes_with_the_longest_run_name_would_be_admitted(case):
    for obj in _objects(GENERATED[case]):
        assert admission.violations(obj) == [], obj["metadata"]["name"]


def test_generated_shapes_cover_every_kind_of_run():
    runs = [manifests.training(spec_of(config)) for config in GENERATED.values()]
    kinds = {(run["kind"], "coordinator" in run["spec"]) for run in runs}
    assert {("Job", False), ("JobSet", False), ("JobSet", True)} <= kinds
    assert len(GENERATED) >= len(tpu.catalog())


@pytest.mark.parametrize("stack", ["dev", "multihost", "multislice"])
def test_the_config_limit_on_run_names_is_where_admission_starts_refusing(stack):
    """At the limit config allows, the objects are admitted; one character more (which config
    refuses) and they would not be: the limit is the boundary, not merely safe."""
    config = stack_config(stack)
    limit = names.run_name_max(slices=config.tpu.slices, hosts_per_slice=config.slice.hosts)
    at_limit = spec_of(edited_config(stack, training={"runName": "r" * limit}))
    assert admission.violations(manifests.training(at_limit)) == []
    one_more = dataclasses.replace(at_limit, name="r" + at_limit.name)
    assert admission.violations(manifests.training(one_more))
    with pytest.raises(ConfigError, match="runName"):
        edited_config(stack, training={"runName": "r" * (limit + 1)})


def _training(stack):
    return manifests.training(spec_of(stack_config(stack)))


def _job(obj):
    return obj["spec"] if obj["kind"] == "Job" else obj["spec"]["replicatedJobs"][0]["template"]["spec"]


def _volume(obj, name):
    (volume,) = [v for v in training_pod(obj)["spec"]["volumes"] if v["name"] == name]
    return volume


def _set_mount_options(obj, options):
    _volume(obj, "data")["csi"]["volumeAttributes"]["mountOptions"] = options


def _long_name(obj):
    obj["metadata"]["name"] = "r" * 60


def _container_rename(obj):
    training_pod(obj)["spec"]["containers"][0]["name"] = "Trainer"


def _cache_unbounded(obj):
    _volume(obj, "data")["csi"]["volumeAttributes"]["fileCacheCapacity"] = "-1"
    _volume(obj, "gke-gcsfuse-cache")["emptyDir"] = {}


def _cache_as_large_as_its_volume(obj):
    size = _volume(obj, "gke-gcsfuse-cache")["emptyDir"]["sizeLimit"]
    _volume(obj, "data")["csi"]["volumeAttributes"]["fileCacheCapacity"] = size


# (rule broken, stack, how): each one a change a builder could plausibly make.
BREAKS = {
    "rule name with hyphens (a defect the builders once had)": ("jobset-failure-policy", "multihost",
        lambda o: o["spec"]["failurePolicy"]["rules"][0].update(name="fail-on-errors")),
    "rule on a reason that is not one": ("jobset-failure-policy", "multihost",
        lambda o: o["spec"]["failurePolicy"]["rules"][0].update(onJobFailureReasons=["OOMKilled"])),
    "rule for a replicated job that does not exist": ("jobset-failure-policy", "multihost",
        lambda o: o["spec"]["failurePolicy"]["rules"][0].update(targetReplicatedJobs=["workers"])),
    "two rules of one name": ("jobset-failure-policy", "multihost",
        lambda o: o["spec"]["failurePolicy"]["rules"].append(dict(o["spec"]["failurePolicy"]["rules"][0]))),
    "JobSet pod names over 63": ("jobset-generated-names", "multihost", _long_name),
    "replicated job name not a DNS-1035 label": ("jobset-generated-names", "multihost",
        lambda o: o["spec"]["replicatedJobs"][0].update(name="1slice")),
    "coordinator address over 63 (a 30-character multislice run)": ("jobset-coordinator", "multislice",
        lambda o: o["metadata"].update(name="r" * 30)),
    "coordinator pod that does not exist": ("jobset-coordinator", "multislice",
        lambda o: o["spec"]["coordinator"].update(podIndex=2)),
    "coordinator job that does not exist": ("jobset-coordinator", "multislice",
        lambda o: o["spec"]["coordinator"].update(jobIndex=2)),
    "coordinator of an unknown replicated job": ("jobset-coordinator", "multislice",
        lambda o: o["spec"]["coordinator"].update(replicatedJob="workers")),
    "Job name over its pod label": ("job-name-fits-its-pod-label", "dev", lambda o: o["metadata"].update(name="r" * 64)),
    "podFailurePolicy with restartPolicy OnFailure": ("pod-failure-policy", "dev",
        lambda o: training_pod(o)["spec"].update(restartPolicy="OnFailure")),
    "podFailurePolicy naming a missing container": ("pod-failure-policy", "multihost",
        lambda o: _job(o)["podFailurePolicy"]["rules"][1]["onExitCodes"].update(containerName="train")),
    "podFailurePolicy codes out of order": ("pod-failure-policy", "dev",
        lambda o: _job(o)["podFailurePolicy"]["rules"][1]["onExitCodes"].update(values=[143, 75])),
    "podFailurePolicy In on exit code 0": ("pod-failure-policy", "dev",
        lambda o: _job(o)["podFailurePolicy"]["rules"][1]["onExitCodes"].update(operator="In", values=[0, 1])),
    "podFailurePolicy pod condition without a type": ("pod-failure-policy", "dev",
        lambda o: _job(o)["podFailurePolicy"]["rules"][0]["onPodConditions"][0].update(type="")),
    "podFailurePolicy rule with both matchers": ("pod-failure-policy", "multihost",
        lambda o: _job(o)["podFailurePolicy"]["rules"][0].update(onExitCodes={"operator": "In", "values": [1]})),
    "podFailurePolicy FailIndex without backoffLimitPerIndex": ("pod-failure-policy", "multihost",
        lambda o: _job(o)["podFailurePolicy"]["rules"][1].update(action="FailIndex")),
    "JobSet message pattern that does not compile": ("jobset-failure-policy", "multislice",
        lambda o: o["spec"]["failurePolicy"]["rules"][0].update(onJobFailureMessagePatterns=["^Pod (unclosed"])),
    "JobSet message pattern that is not RE2": ("jobset-failure-policy", "multislice",
        lambda o: o["spec"]["failurePolicy"]["rules"][0].update(onJobFailureMessagePatterns=["(?=Pod)Pod"])),
    "pod restartPolicy Always": ("pod-restart-policy", "dev", lambda o: training_pod(o)["spec"].update(restartPolicy="Always")),
    "container name not a DNS label": ("names-are-dns-labels", "dev", _container_rename),
    "port name over 15": ("names-are-dns-labels", "dev",
        lambda o: training_pod(o)["spec"]["containers"][0].update(ports=[{"name": "profiler-server-port", "containerPort": 9012}])),
    "label value over 63": ("labels-are-valid", "dev", lambda o: o["metadata"]["labels"].update(run="r" * 64)),
    "port name used twice": ("pod-references", "dev",
        lambda o: training_pod(o)["spec"]["containers"][0]["ports"].append({"name": "tpu-metrics", "containerPort": 9012})),
    "container port 0": ("pod-references", "multihost",
        lambda o: training_pod(o)["spec"]["containers"][0]["ports"].append({"name": "profiler", "containerPort": 0})),
    "mount of a volume the pod lacks": ("pod-references", "dev",
        lambda o: training_pod(o)["spec"]["containers"][0]["volumeMounts"].append({"name": "scratch", "mountPath": "/tmp/x"})),
    "TPU request below its limit": ("extended-resources", "multihost",
        lambda o: training_pod(o)["spec"]["containers"][0]["resources"].update(requests={"google.com/tpu": "2"})),
    "runAsNonRoot as uid 0": ("non-root-user", "dev", lambda o: training_pod(o)["spec"]["securityContext"].update(runAsUser=0)),
    "allow_other among the mount options (a defect the builders once had)": ("gcs-fuse-volumes", "dev",
        lambda o: _set_mount_options(o, "uid=1000,gid=1000,allow_other")),
    "o=allow_other": ("gcs-fuse-volumes", "dev", lambda o: _set_mount_options(o, "uid=1000,o=allow_other")),
    "uid written config-file style": ("gcs-fuse-volumes", "dev", lambda o: _set_mount_options(o, "uid:1000")),
    "misspelt volume attribute": ("gcs-fuse-volumes", "dev",
        lambda o: _volume(o, "data")["csi"]["volumeAttributes"].update(fileCacheCapacty="10Gi")),
    "cache capacity that is not a quantity": ("gcs-fuse-volumes", "dev",
        lambda o: _volume(o, "data")["csi"]["volumeAttributes"].update(fileCacheCapacity="20 GB")),
    "unbounded cache on an unbounded emptyDir (a defect the builders once had)": ("gcs-fuse-volumes", "multislice", _cache_unbounded),
    "cache as large as its volume": ("gcs-fuse-volumes", "dev", _cache_as_large_as_its_volume),
    "custom cache volume without fsGroup": ("gcs-fuse-volumes", "dev",
        lambda o: training_pod(o)["spec"]["securityContext"].pop("fsGroup")),
    "FUSE volumes without the sidecar annotation": ("gcs-fuse-volumes", "dev",
        lambda o: training_pod(o)["metadata"]["annotations"].pop("gke-gcsfuse/volumes")),
    "a queued run that sets spec.suspend (a defect the builders once had)": ("kueue-queued-objects", "queued",
        lambda o: o["spec"].update(suspend=True)),
    "a queue name that is no object name": ("kueue-queued-objects", "queued",
        lambda o: o["metadata"]["labels"].update({admission.QUEUE_LABEL: "TPU queue"})),
    "a priority without a queue": ("kueue-queued-objects", "queued", lambda o: o["metadata"]["labels"].pop(admission.QUEUE_LABEL)),
    "a max run duration past flex-start's 7 days": ("kueue-queued-objects", "queued",
        lambda o: o["metadata"]["annotations"].update({"provreq.kueue.x-k8s.io/maxRunDurationSeconds": "1209600"})),
    "a max run duration that is not whole seconds": ("kueue-queued-objects", "queued",
        lambda o: o["metadata"]["annotations"].update({"provreq.kueue.x-k8s.io/maxRunDurationSeconds": "7d"})),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BREAKS))
def test_each_rule_refuses_an_object_that_breaks_it(case):
    rule_name, stack, damage = BREAKS[case]
    obj = copy.deepcopy(_training(stack))
    assert admission.violations(obj) == []
    damage(obj)
    found = admission.violations(obj)
    assert any(line.startswith(f"{rule_name}: ") for line in found), found


def test_every_rule_has_a_test_that_breaks_it():
    # The serving objects' rules are broken in tests/workloads/test_serving.py.
    assert {rule_name for rule_name, _, _ in BREAKS.values()} == set(admission.RULES) - set(admission_serving.SERVING_RULES)


@pytest.mark.parametrize(
    ("option", "accepted"),
    [("uid=1000", True), ("gid=1000", True), ("ro", True), ("implicit-dirs", True), ("file-cache:max-size-mb:1024", True),
     ("allow_other", False), ("default_permissions", False), ("o=allow_other", False), ("uid:1000", False), ("uid-1000", False)],
)  # fmt: skip
def test_mount_options_as_the_driver_and_gcsfuse_take_them(option, accepted):
    assert (admission.mount_option_problem(option) is None) == accepted
