"""What the builders promise a user, stack by stack: the shape and size of the run, where its pods
land, what happens when a pod fails, that data comes first, and what the trainer is told."""

import json
import math
import re

import pytest

from infra.catalog import tpu
from tests.workloads import failure_events
from tests.workloads.conftest import REPO, IMAGE, STACKS, container, edited_config, spec_of, stack_config, training_pod
from trainer import contract
from trainer.run import tpu_flags
from trainer.data import prepare
from trainer.config import parse_config
from workloads import manifests, preparation
from workloads.__main__ import stack_objects
from trainer.contract import PREPARED_MARKER_FILE
from workloads.spec import ARTIFACTS_MOUNT

EXCLUSIVE = "alpha.jobset.sigs.k8s.io/exclusive-topology"


def env_of(container_spec):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container_spec.get("env", [])}


@pytest.mark.parametrize("stack", STACKS)
def test_run_size_and_placement_follow_the_catalog(stack):
    config = stack_config(stack)
    catalog = tpu.slice_spec(config.tpu.accelerator, config.tpu.topology)
    run = manifests.training(spec_of(config))
    pod = training_pod(run)
    trainer = container(pod, manifests.TRAINER_CONTAINER)
    assert trainer["resources"]["limits"]["google.com/tpu"] == str(catalog.chips_per_host)
    assert trainer["resources"]["requests"] == trainer["resources"]["limits"]
    # Shipped stacks are on-demand; with multi-tier checkpointing the pods also select the machine type its
    # CheckpointConfiguration serves.
    machine = {"node.kubernetes.io/instance-type": catalog.machine_type} if config.multi_tier else {}
    assert pod["spec"]["nodeSelector"] == catalog.node_selector | machine
    slices = config.runs[0].slices  # the stack's slices, unless a run of gemma-tpu:runs takes fewer
    if catalog.hosts * slices == 1:
        assert run["kind"] == "Job" and "parallelism" not in run["spec"]
    else:
        (replicated,) = run["spec"]["replicatedJobs"]
        assert run["kind"] == "JobSet"
        assert replicated["replicas"] == slices
        assert replicated["template"]["spec"]["parallelism"] == catalog.hosts
        assert replicated["template"]["spec"]["completions"] == catalog.hosts
    assert (EXCLUSIVE in run["metadata"].get("annotations", {})) == (config.tpu.slices > 1)


def test_multislice_is_two_slices_of_two_hosts_with_four_chips_placed_exclusively():
    run = manifests.training(spec_of(stack_config("multislice")))
    (replicated,) = run["spec"]["replicatedJobs"]
    pod = training_pod(run)
    assert (replicated["replicas"], replicated["template"]["spec"]["parallelism"]) == (2, 2)
    assert container(pod, "trainer")["resources"]["limits"]["google.com/tpu"] == "4"
    assert pod["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "2x4"
    assert run["metadata"]["annotations"][EXCLUSIVE] == "cloud.google.com/gke-nodepool"


@pytest.mark.parametrize(
    ("tpu_changes", "selector"),
    [
        ({"capacity": "spot"}, {"cloud.google.com/gke-spot": "true"}),
        ({"capacity": "flex-start"}, {"cloud.google.com/gke-flex-start": "true"}),
    ],
)
def test_capacity_adds_its_selector(tpu_changes, selector):
    config = edited_config("multihost", tpu=tpu_changes)
    pod = training_pod(manifests.training(spec_of(config)))
    assert pod["spec"]["nodeSelector"] == {**config.slice.node_selector, **selector}
    assert "affinity" not in pod["spec"]


@pytest.mark.parametrize("reservation", ["my-tpus", "projects/team-project/reservations/shared-v6e"])
@pytest.mark.parametrize("stack", ["multihost", "multislice"])
def test_reserved_pods_select_the_reservations_node_pools(stack, reservation):
    """A node pool bound to a reservation carries no reservation label (GKE sets
    cloud.google.com/reservation-name on auto-provisioned and Autopilot nodes only)."""
    config = edited_config(stack, tpu={"capacity": "reservation", "reservation": reservation}, cluster={"multiTierCheckpointing": None})
    pod = training_pod(manifests.training(spec_of(config)))
    assert pod["spec"]["nodeSelector"] == config.slice.node_selector
    (term,) = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    pools = [f"tpu-slice-{index}" for index in range(config.tpu.slices)]
    assert term == {"matchExpressions": [{"key": "cloud.google.com/gke-nodepool", "operator": "In", "values": pools}]}


def test_autopilot_selects_by_labels_only_and_standard_runs_preparation_on_the_cpu_pool():
    for stack in STACKS:
        spec = spec_of(stack_config(stack))
        selectors = [training_pod(manifests.training(spec))["spec"]["nodeSelector"],
                     preparation.preparation_job(spec)["spec"]["template"]["spec"]["nodeSelector"]]  # fmt: skip
        pool_selected = ["cloud.google.com/gke-nodepool" in s for s in selectors]
        autopilot = stack_config(stack).cluster_mode == "autopilot"
        assert pool_selected == ([False, False] if autopilot else [False, True]), stack


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("failure", failure_events.EVENTS, ids=lambda failure: failure.event)
def test_disruptions_restart_uncounted_errors_and_oom_fail_at_once_and_retry_me_is_counted(stack, failure):
    run = manifests.training(spec_of(stack_config(stack)))
    assert failure_events.fate(run, failure) == failure.outcome


# GKE's node allocatable (the machine's memory less 25% of the first 4 GiB, 20% of the next 4, 10% of
# the next 8, 6% of the next 112, 2% above 128 and the 100 MiB eviction threshold), less 8 GiB for
# the FUSE sidecar and the node's daemons: e.g. 720 GB = 670.6 GiB - 20.2 - 0.1 = 650 -> 642 GiB.
TRAINER_MEMORY_GIB = {"ct6e-standard-1t": 394, "ct6e-standard-4t": 642, "ct5lp-hightpu-1t": 32,
                      "ct5lp-hightpu-4t": 160, "ct5p-hightpu-4t": 394}  # fmt: skip


@pytest.mark.parametrize("spec", tpu.catalog(), ids=lambda s: f"{s.accelerator}-{s.topology}")
def test_on_standard_the_trainer_is_oom_killed_before_its_node_runs_short_of_memory(spec):
    """A node-pressure eviction carries DisruptionTarget, which restarts a run uncounted: were the
    trainer what fills the node, it would restart forever. Its memory limit (and request, so the
    kubelet evicts it last) is below what GKE leaves to pods; past it the trainer is OOM-killed and
    the run fails, counted (see the table). Autopilot sets each container's limit itself."""
    tpu_keys = {"accelerator": spec.accelerator, "topology": spec.topology}
    standard = training_pod(manifests.training(spec_of(edited_config("dev", tpu=tpu_keys))))
    resources = container(standard, "trainer")["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"] == f"{TRAINER_MEMORY_GIB[spec.machine_type]}Gi"
    autopilot = training_pod(manifests.training(spec_of(edited_config("autopilot", tpu=tpu_keys))))
    assert "memory" not in container(autopilot, "trainer")["resources"]["limits"]


@pytest.mark.parametrize("stack", STACKS)
def test_restarts_are_capped_and_pods_have_time_to_checkpoint(stack):
    config = stack_config(stack)
    run = manifests.training(spec_of(config))
    restarts = run["spec"]["backoffLimit"] if run["kind"] == "Job" else run["spec"]["failurePolicy"]["maxRestarts"]
    assert restarts == config.runs[0].training.max_restarts
    pod = training_pod(run)["spec"]
    assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] >= 60


def test_docs_table_of_pod_failures_is_what_the_objects_do():
    assert failure_events.shipped_table() in (REPO / "docs" / "workloads.md").read_text(), (
        "regenerate the table in docs/workloads.md with `python -m tests.workloads.failure_events`"
    )


def test_max_restarts_comes_from_the_stack_config():
    for stack in ("dev", "multislice"):
        run = manifests.training(spec_of(edited_config(stack, training={"maxRestarts": 3})))
        limit = run["spec"]["backoffLimit"] if run["kind"] == "Job" else run["spec"]["failurePolicy"]["maxRestarts"]
        assert limit == 3


def preparation_args(prep):
    """The preparation container's command line as `python -m trainer.data.prepare` parses it."""
    prepare_container = container(prep["spec"]["template"], preparation.PREPARE_CONTAINER)
    assert prepare_container["command"] == ["python", "-m", "trainer.data.prepare"]
    assert "env" not in prepare_container  # everything it is told is in its arguments
    return prepare.parse_args(prepare_container["args"])


@pytest.mark.parametrize("stack", STACKS)
def test_training_waits_for_the_prepared_data_it_reads(stack):
    spec = spec_of(stack_config(stack))
    prep = preparation.preparation_job(spec)
    output = preparation_args(prep).output
    pod = training_pod(manifests.training(spec))
    # No init container: a pod waiting for its data is Ready, so Kueue's waitForPodsReady (30
    # minutes in v0.19, less than the preparation's deadline) does not requeue a queued run for it.
    assert "initContainers" not in pod["spec"]
    wait = container(pod, "trainer")["command"]
    assert PREPARED_MARKER_FILE == prepare.META_FILE  # the file trainer.data.prepare renames into place
    assert wait[:2] == ["sh", "-c"] and f"{output}/{prepare.META_FILE}" in wait[2]  # it polls exactly that file
    # ... then runs the image's entrypoint with the container's args (under trainer.supervise with a local tier).
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (.*)$", (REPO / "trainer" / "Dockerfile").read_text(), re.M).group(1))
    supervised = "python -m trainer.supervise -- " if spec.local_checkpoint_gib is not None else ""
    assert wait[2].endswith(f'exec {supervised}{" ".join(entrypoint)} "$@"')
    trainer_args = container(pod, "trainer")["args"]
    assert trainer_args[trainer_args.index("--data") + 1] == output
    # Both see the same bucket at the same path.
    buckets = [
        {v["name"]: v["csi"]["volumeAttributes"]["bucketName"] for v in p["spec"]["volumes"] if _fuse(v)}["data"]
        for p in (prep["spec"]["template"], pod)
    ]
    assert buckets == [spec.data_bucket] * 2


def test_preparation_fails_at_once_on_bad_input():
    prep = preparation.preparation_job(spec_of(stack_config("dev")))
    (rule,) = prep["spec"]["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["values"] == [contract.USER_ERROR]


@pytest.mark.parametrize(
    ("dataset", "input_arg", "extra_volume"),
    [
        ("https://example.com/corpus.txt", "https://example.com/corpus.txt", "scratch"),
        ("gs://my-project-dev-data/raw/corpus.txt", "/data/raw/corpus.txt", None),
        ("gs://corpora/raw/corpus.txt", "/source/raw/corpus.txt", "source"),
    ],
)
def test_the_dataset_reaches_preparation_by_download_or_mount(dataset, input_arg, extra_volume):
    spec = spec_of(edited_config("dev", training={"dataset": dataset}))
    prep = preparation.preparation_job(spec)
    pod = prep["spec"]["template"]
    args = preparation_args(prep)
    assert (args.input, args.tokenizer, args.output) == (input_arg, prepare.OFFICIAL, spec.prepared_path)
    mounts = {m["name"]: m["mountPath"] for m in container(pod, "prepare")["volumeMounts"]}
    assert args.download_dir == mounts.get("scratch")  # a URL is downloaded into the scratch volume
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert set(volumes) == {"data"} | ({extra_volume} if extra_volume else set())
    if extra_volume == "source":
        assert volumes["source"]["csi"]["volumeAttributes"]["bucketName"] == "corpora"
        assert volumes["source"]["csi"]["readOnly"] is True


@pytest.mark.parametrize("stack", STACKS)
def test_buckets_are_fuse_volumes_data_read_only_and_cached(stack):
    spec = spec_of(stack_config(stack))
    pod = training_pod(manifests.training(spec))
    assert pod["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    data, artifacts = volumes["data"]["csi"], volumes["artifacts"]["csi"]
    assert (data["volumeAttributes"]["bucketName"], data["readOnly"]) == (spec.data_bucket, True)
    assert data["volumeAttributes"]["fileCacheForRangeRead"] == "true"
    assert (artifacts["volumeAttributes"]["bucketName"], artifacts["readOnly"]) == (spec.artifacts_bucket, False)
    assert "fileCacheCapacity" not in artifacts["volumeAttributes"]  # written, not re-read
    mounts = {m["name"]: m for m in container(pod, "trainer")["volumeMounts"]}
    assert mounts["data"]["readOnly"] is True and not mounts["artifacts"].get("readOnly")
    assert pod["spec"]["serviceAccountName"] == spec.service_account == stack_config(stack).service_account


def _gib(quantity: str) -> int:
    assert quantity.endswith("Gi"), quantity
    return int(quantity.removesuffix("Gi"))


@pytest.mark.parametrize("cache_gib", [None, 7, 300])
@pytest.mark.parametrize("stack", STACKS)
def test_the_data_cache_is_bounded_and_the_pod_asks_for_its_disk(stack, cache_gib):
    """An unbounded cache on an emptyDir fills the node's disk, and evicts the pod on Autopilot."""
    config = edited_config(stack, storage={"dataCacheGiB": cache_gib})
    assert config.data_cache_gib == (cache_gib or 20)
    pod = training_pod(manifests.training(spec_of(config)))
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    cache = _gib(volumes["data"]["csi"]["volumeAttributes"]["fileCacheCapacity"])
    volume = _gib(volumes["gke-gcsfuse-cache"]["emptyDir"]["sizeLimit"])
    requested = container(pod, "trainer")["resources"]["requests"]["ephemeral-storage"]
    assert cache == config.data_cache_gib
    assert cache < volume < _gib(requested)  # gcsfuse needs room past the cache, the container some of its own
    assert pod["spec"]["securityContext"]["fsGroup"] == pod["spec"]["securityContext"]["runAsUser"]  # the sidecar writes the cache


@pytest.mark.parametrize("stack", STACKS)
def test_data_preparation_writes_the_data_bucket_as_its_own_account(stack):
    spec = spec_of(stack_config(stack))
    prepare = preparation.preparation_job(spec)["spec"]["template"]["spec"]
    train = training_pod(manifests.training(spec))["spec"]
    assert (prepare["serviceAccountName"], train["serviceAccountName"]) == ("trainer-prep", "trainer")
    assert {v["name"]: v["csi"]["readOnly"] for v in prepare["volumes"] if v["name"] == "data"} == {"data": False}
    annotations = {a["metadata"]["name"]: a["metadata"]["annotations"] for a in manifests.service_accounts(spec)}
    assert annotations == {
        "trainer": {"iam.gke.io/gcp-service-account": f"gemma-{stack}-train@my-project.iam.gserviceaccount.com"},
        "trainer-prep": {"iam.gke.io/gcp-service-account": f"gemma-{stack}-prep@my-project.iam.gserviceaccount.com"},
    }


@pytest.mark.parametrize("stack", STACKS)
def test_the_trainer_gets_the_stack_training_config_and_slice_count(stack):
    config = stack_config(stack)
    pod = training_pod(manifests.training(spec_of(config)))
    trainer = container(pod, "trainer")
    parsed = parse_config(trainer["args"])  # the trainer's own parser accepts the command line
    training = config.runs[0].training
    assert (parsed.model, parsed.weights, parsed.seq_len, parsed.batch_size) == (
        training.model, training.weights, training.seq_len, training.batch_size
    )
    assert (parsed.steps, parsed.epochs, parsed.lr, parsed.lora_rank) == (
        training.steps, training.epochs, training.learning_rate, training.lora_rank
    )
    assert parsed.checkpoint_interval == training.checkpoint_interval
    for directory in (parsed.workdir, parsed.resolved_checkpoint_dir, parsed.resolved_tensorboard_dir):
        assert directory.startswith(f"{ARTIFACTS_MOUNT}/runs/{training.run_name}-")
    assert parsed.profile_port is None
    env = env_of(trainer)
    assert env["JAX_PLATFORMS"] == "tpu"  # no TPU is an error, never a run on the host's CPU
    assert env["MEGASCALE_NUM_SLICES"] == str(config.runs[0].slices)
    assert ("MEGASCALE_SLICE_ID" in env) == (config.runs[0].slices > 1)
    assert env["LIBTPU_INIT_ARGS"] == tpu_flags.libtpu_init_args(config.tpu.accelerator)  # the flags `fit` compiles with


def test_multislice_pods_know_their_slice_and_the_coordinator():
    run = manifests.training(spec_of(stack_config("multislice")))
    env = env_of(container(training_pod(run), "trainer"))
    assert "jobset.sigs.k8s.io/job-index" in env["MEGASCALE_SLICE_ID"]["fieldRef"]["fieldPath"]
    assert "jobset.sigs.k8s.io/coordinator" in env["MEGASCALE_COORDINATOR_ADDRESS"]["fieldRef"]["fieldPath"]
    assert run["spec"]["coordinator"] == {"replicatedJob": manifests.SLICE_JOB, "jobIndex": 0, "podIndex": 0}


def test_profiling_opens_the_profiler_port_and_writes_to_the_artifacts_bucket():
    pod = training_pod(manifests.training(spec_of(edited_config("dev", training={"profiling": True}))))
    trainer = container(pod, "trainer")
    parsed = parse_config(trainer["args"])
    assert {"name": "profiler", "containerPort": parsed.profile_port} in trainer["ports"]
    assert parsed.profile_dir.startswith(f"{ARTIFACTS_MOUNT}/runs/")


@pytest.mark.parametrize("stack", STACKS)
def test_training_pods_export_tpu_metrics_and_log_json_lines(stack):
    """GKE reads the TPU runtime metrics (duty cycle, HBM) from the container's port 8431, and the
    stack's log-based metrics read the trainer's JSON report lines."""
    trainer = container(training_pod(manifests.training(spec_of(stack_config(stack)))), "trainer")
    assert {"name": "tpu-metrics", "containerPort": 8431} in trainer["ports"]
    assert parse_config(trainer["args"]).log_format == "json"


def test_run_name_changes_with_the_training_config_or_image_and_only_then():
    config = stack_config("multihost")
    base = spec_of(config)
    assert spec_of(config).name == base.name
    assert spec_of(edited_config("multihost", training={"learningRate": 1e-4})).name != base.name
    assert spec_of(config, image=IMAGE.replace("0123", "4567")).name != base.name
    # A key added since (gemma-tpu:training.gradAccumSteps) names the run only when it is not the trainer's default.
    assert spec_of(edited_config("multihost", training={"gradAccumSteps": 1})).name == base.name
    assert spec_of(edited_config("multihost", training={"gradAccumSteps": 2})).name != base.name
    renamed = spec_of(edited_config("multihost", training={"runName": "other"}))
    assert renamed.name.startswith("other-")
    # The prepared data depends on the corpus only: a new run reuses it.
    assert spec_of(edited_config("multihost", training={"learningRate": 1e-4})).prepared_dir == base.prepared_dir


def _fuse(volume) -> bool:
    """A GCS FUSE volume (not the multi-tier checkpointing one, which takes no attributes)."""
    return volume.get("csi", {}).get("driver") == "gcsfuse.csi.storage.gke.io"


def _check_pod_security(pod, *, root: bool) -> None:
    security = pod["spec"]["securityContext"]
    assert (security["runAsNonRoot"], security["runAsUser"] == 0) == (not root, root)
    for volume in (v for v in pod["spec"]["volumes"] if _fuse(v)):  # the user owns the FUSE mounts
        options = volume["csi"]["volumeAttributes"]["mountOptions"].split(",")
        assert {f"uid={security['runAsUser']}", f"gid={security['runAsGroup']}"} <= set(options)
    for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
        assert c["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert not any("hostPath" in v for v in pod["spec"]["volumes"])


def test_security_non_root_no_privilege_and_no_host_paths():
    for stack in STACKS:
        spec = spec_of(stack_config(stack))
        for pod in (training_pod(manifests.training(spec)), preparation.preparation_job(spec)["spec"]["template"]):
            _check_pod_security(pod, root=False)


@pytest.mark.parametrize("stack", STACKS)
def test_the_root_fallback_makes_only_training_pods_root_and_keeps_capabilities_dropped(stack):
    """gemma-tpu:trainerRunsAsRoot, for TPU device files that the image's user cannot open."""
    spec = spec_of(edited_config(stack, trainerRunsAsRoot=True))
    _check_pod_security(training_pod(manifests.training(spec)), root=True)
    _check_pod_security(preparation.preparation_job(spec)["spec"]["template"], root=False)
    assert spec.name == spec_of(stack_config(stack)).name  # the same run: it resumes from its checkpoints


@pytest.mark.parametrize("stack", STACKS)
def test_the_trainer_mesh_shards_inside_a_slice_and_is_data_parallel_across_slices(stack):
    from trainer.run.mesh import resolve_axis_sizes

    config = stack_config(stack)
    parsed = parse_config(container(training_pod(manifests.training(spec_of(config))), "trainer")["args"])
    all_chips = config.slice.chips * config.tpu.slices
    assert resolve_axis_sizes(parsed.mesh, all_chips) == {"data": config.tpu.slices, "fsdp": config.slice.chips}
    if stack == "multislice":
        assert parsed.mesh["fsdp"] == 8 and resolve_axis_sizes(parsed.mesh, all_chips)["data"] == 2  # the DCN axis


def test_the_preparation_reads_the_dataset_as_the_stack_says_and_keeps_each_reading_apart():
    plain = spec_of(stack_config("multihost"))
    chat = dict(dataset="gs://corpora/chat/train.jsonl", dataFormat="jsonl-chat", lossOn="all", onBadRow="skip")
    configured = spec_of(edited_config("multihost", training=chat))
    args = preparation.preparation_job(configured)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--data-format") + 1] == "jsonl-chat" and args[args.index("--loss-on") + 1] == "all"
    assert args[args.index("--on-bad-row") + 1] == "skip"
    # Defaults pass nothing, so the prepared data of a stack that sets none keeps its directory.
    plain_args = preparation.preparation_job(plain)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not {"--data-format", "--loss-on", "--on-bad-row"} & set(plain_args)
    same_data = spec_of(edited_config("multihost", training={"dataset": chat["dataset"]}))
    masked_all = spec_of(edited_config("multihost", training={"dataset": chat["dataset"], "lossOn": "all"}))
    assert same_data.prepared_dir != masked_all.prepared_dir and same_data.name != masked_all.name


@pytest.mark.parametrize("stack", STACKS)
def test_the_local_tier_is_a_bounded_memory_volume_of_a_supervised_trainer(stack):
    from trainer.measure import flops
    from trainer.gemma3.config import MODELS

    # In host memory: the multi-tier volume is the test below's.
    config = edited_config(stack, training={"localCheckpointInterval": "auto"}, cluster={"multiTierCheckpointing": None})
    spec, unset = spec_of(config), spec_of(edited_config(stack, training={"localCheckpointInterval": None},
                                                         cluster={"multiTierCheckpointing": None}))
    pod = training_pod(manifests.training(spec))
    trainer = container(pod, "trainer")
    # Three steps (2 kept, 1 being written) of this host's share: float32 weights and AdamW moments, 12
    # bytes a trained parameter, a full fine-tune's split over the slice's hosts, LoRA's adapters whole
    # on each; then 1 GiB of margin.
    training, model = config.runs[0].training, MODELS[config.runs[0].training.model]
    rank = training.lora_rank
    share = 12 * (flops.lora_param_count(model, rank) if rank else flops.param_count(model) / config.slice.hosts)
    volume = {"name": "local-checkpoints", "emptyDir": {"medium": "Memory", "sizeLimit": f"{math.ceil(3 * share / 2**30) + 1}Gi"}}
    assert volume in pod["spec"]["volumes"]
    assert {"name": "local-checkpoints", "mountPath": "/local-checkpoints"} in trainer["volumeMounts"]
    parsed = parse_config(trainer["args"])
    assert (parsed.local_checkpoint_dir, parsed.local_checkpoint_interval) == ("/local-checkpoints", "auto")
    assert trainer["command"][2].endswith('exec python -m trainer.supervise -- python -m trainer "$@"')
    # The tier lives inside the trainer's memory bound, which stays the host's (infra.config.runs checks it fits).
    assert trainer["resources"] == container(training_pod(manifests.training(unset)), "trainer")["resources"]
    # Unset: no volume, no flag, no supervisor, and the run keeps its name; set, it is another run.
    plain = container(training_pod(manifests.training(unset)), "trainer")
    assert "--local-checkpoint-dir" not in plain["args"] and "trainer.supervise" not in plain["command"][2]
    assert unset.name != spec.name


def test_multi_tier_checkpointing_puts_the_local_tier_on_the_nodes_volume_in_the_jobset_shape_gke_reads():
    """What GKE's rank server and CSI driver need of the JobSet (../shared/mtc/pod-spec.md), and the trainer's
    flags for it; the CheckpointConfiguration sized by the local tier, on the nodes the pods select."""
    config = stack_config("multislice")
    spec = spec_of(config)
    jobset = manifests.training(spec)
    (replicated,) = jobset["spec"]["replicatedJobs"]  # exactly one, or the rank server skips the JobSet
    assert replicated["replicas"] == config.tpu.slices == 2
    assert replicated["template"]["spec"]["parallelism"] == config.slice.hosts == 2
    assert jobset["metadata"]["annotations"]["alpha.jobset.sigs.k8s.io/exclusive-topology"] == "cloud.google.com/gke-nodepool"
    pod = training_pod(jobset)
    trainer = container(pod, "trainer")
    assert {"name": "local-checkpoints", "csi": {"driver": "multitier-checkpoint.csi.storage.gke.io"}} in pod["spec"]["volumes"]
    parsed = parse_config(trainer["args"])
    mount = {m["name"]: m["mountPath"] for m in trainer["volumeMounts"]}["local-checkpoints"]
    assert (parsed.local_checkpoint_dir, parsed.multi_tier_backup_minutes) == (mount, 30)
    assert {"name": "JOBSET_NAME", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.annotations['jobset.sigs.k8s.io/jobset-name']"}}} in trainer["env"]
    assert {"name": "jax-coordinator", "containerPort": 8476} in trainer["ports"]
    (configuration,) = [obj for obj in stack_objects(config) if obj["kind"] == "CheckpointConfiguration"]
    assert configuration["spec"]["nodeSelector"].items() <= pod["spec"]["nodeSelector"].items()
    # The RAM disk is the local tier's size (infra.config.runs.local_tier_gib), and leaves the trainer's bound.
    in_host_memory = spec_of(edited_config("multislice", cluster={"multiTierCheckpointing": None}))
    assert configuration["spec"]["inMemoryVolumeSize"] == f"{in_host_memory.local_checkpoint_gib}Gi"
    memory = int(trainer["resources"]["limits"]["memory"].removesuffix("Gi"))
    assert memory + in_host_memory.local_checkpoint_gib == in_host_memory.trainer_memory_gib
