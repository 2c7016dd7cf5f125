"""What one training run needs, derived from the stack config and the TPU catalog.

`run_spec(config, run, image=...)` is the single place where stack choices become run facts: the shape
(a batch/v1 Job for one host, a JobSet otherwise), pods per slice, chips per pod, node selectors,
bucket paths, the trainer's command line and environment. `workloads.manifests` turns a RunSpec
into Kubernetes objects without deciding anything itself.
"""

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from typing import Literal

from infra.catalog.names import CPU_POOL_NAME, NODE_POOL_LABEL, run_kind, run_object_name, tpu_pool_names
from infra.cloud.checkpointing import in_memory_volume_gib, node_selector
from infra.config import RunConfig, StackConfig
from infra.config.runs import local_tier_gib
from infra.config.slices import trainer_memory_gib
from infra.config.training import PreparationConfig, trainer_flags
from infra.queueing.queues import FLEX_START_MAX_RUN_SECONDS, LOCAL_QUEUE, priority_class_name
from trainer import contract
from trainer.contract import PREPARED_MARKER_FILE, PUBLISHED_DIR, PUBLISHED_MODEL_DIR, TRAINER_UID
from trainer.run import tpu_flags

DATA_MOUNT = "/data"  # the data bucket, read-only in training pods
ARTIFACTS_MOUNT = "/artifacts"  # the artifacts bucket: checkpoints, TensorBoard events, profiles, published exports
# The local checkpoint tier (gemma-tpu:training.localCheckpointInterval): a memory-backed volume of the pod,
# which outlives a crash of the trainer process (trainer.supervise restarts it in the pod) but not the pod.
LOCAL_CHECKPOINT_MOUNT = "/local-checkpoints"
# JAX's persistent compilation cache in the artifacts bucket, one for the stack's runs: a restarted or relaunched
# run reads its compiled programs back (entries are keyed by program, devices and versions, so runs share it).
COMPILATION_CACHE_DIR = "compilation-cache"
PROFILE_PORT = 9012  # jax.profiler.start_server port, exposed when training.profiling is on
# The port GKE reads a TPU container's runtime metrics from (duty cycle, HBM use: the
# kubernetes.io/container/accelerator/* metrics); GKE's TPU manifests declare it on the container
# ("Port to export TPU runtime metrics, if supported": cloud.google.com/kubernetes-engine/docs/how-to/tpus).
TPU_METRICS_PORT = 8431
# SIGTERM reaches the trainer, which checkpoints at the next step (one step plus an Orbax save of
# parameters and optimizer state through the FUSE mount) and exits with contract.RETRY. Five
# minutes covers Gemma 3 up to 4B; Spot VMs give 30 s whatever is set, and then the last interval
# checkpoint is what the restart resumes from.
TERMINATION_GRACE_SECONDS = 300
# Data preparation downloads and tokenizes the corpus once (TinyStories: ~2 GB of text). Past this
# it is stopped, and training pods waiting for its output give up after the same time.
PREPARE_DEADLINE_SECONDS = 2 * 3600
# Exit codes after which a run is restarted (from its last checkpoint), counted against maxRestarts:
# the trainer's own "I checkpointed, retry me" and a SIGTERM (128+15) that came before its handler.
# Any other non-zero code fails the run at once: a code or config error, or a SIGKILL (128+9) of the
# kernel's OOM killer, which a restart would only meet again. A preemption, eviction or node
# shutdown is told apart by the pod's DisruptionTarget condition, whatever the code (manifests).
RETRYABLE_EXIT_CODES = (contract.RETRY, 128 + 15)

_PREPARED_HASH_CHARS = 8
# 2: a downloaded dataset is recorded by its URL (1: by the preparation pod's scratch copy). A new
# record gives the prepared data a new directory, prepared once beside the old one, rather than a
# complete old one that trainer.data.prepare refuses as "prepared from another source".
PREPARED_SOURCE_RECORD = 2


def tpu_node_pools(config: StackConfig) -> tuple[str, ...]:
    """The node pools training pods must land on: the reservation's or the queued provisioning
    pools (one per slice) on Standard; none (any node the selectors match) otherwise."""
    if config.tpu.capacity != "reservation" and not config.queued_provisioning:
        return ()
    return tpu_pool_names(config.tpu.slices)


Shape = Literal["job", "jobset"]


def run_shape(config: StackConfig, run: RunConfig) -> Shape:
    """A batch/v1 Job for a single host; a JobSet as soon as there are several pods (infra.catalog.names.run_kind)."""
    return "job" if run_kind(slices=run.slices, hosts_per_slice=config.slice.hosts) == "Job" else "jobset"


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    name: str  # the Job / JobSet name: runName plus a hash of everything the run depends on
    namespace: str
    service_account: str  # the training pods' Kubernetes ServiceAccount (infra.cloud.identity)
    google_service_account: str  # the Google account it acts as (Workload Identity)
    prepare_service_account: str  # the data preparation pods' Kubernetes ServiceAccount
    prepare_google_service_account: str  # the Google account it acts as: the data bucket's writer
    image: str
    shape: Shape
    slices: int  # JobSet replicas: one Job per slice
    hosts_per_slice: int  # pods per slice, one per TPU host
    chips_per_host: int  # each pod's `google.com/tpu` request
    tpu_node_selector: dict[str, str]
    tpu_node_pools: tuple[str, ...]  # empty: any node pool the selectors match
    # Each slice's Job on a node pool of its own: as soon as the stack has several pools, a slice's
    # hosts must not be split between two of them (JobSet's exclusive-topology placement).
    exclusive_pools: bool
    cpu_node_selector: dict[str, str]  # data preparation; empty on Autopilot (GKE picks the node)
    data_bucket: str
    data_cache_gib: int  # the file cache of the data mount in each training pod
    pod_disk_gib: int  # each training pod's ephemeral-storage request (cache volume and scratch)
    trainer_memory_gib: int | None  # the trainer container's memory request and limit; None: Autopilot's own
    local_checkpoint_gib: int | None  # the local tier's memory-backed volume in each training pod; None: no local tier
    # With a local tier on a gemma-tpu:cluster.multiTierCheckpointing stack: the node replicator's backup
    # interval; the tier's volume is then GKE's multi-tier checkpointing volume (the node's RAM disk).
    multi_tier_backup_minutes: int | None = None
    multi_tier_node_selector: dict[str, str] | None = None  # the nodes the CheckpointConfiguration's driver runs on
    artifacts_bucket: str
    dataset: str  # https:// URL or gs:// path of the raw data (text, JSONL or Parquet)
    preparation_flags: tuple[str, ...]  # trainer.data.prepare's flags for how it reads the dataset
    prepared_dir: str  # the prepared shards, relative to the data bucket
    prepare_name: str  # the data preparation Job's name (one per dataset)
    run_dir: str  # this run's directory, relative to the artifacts bucket
    publish_dir: str  # where its exports are published for serving: by the run's name, which no rebuild changes
    trainer_args: tuple[str, ...]
    trainer_env: dict[str, str]
    max_restarts: int
    profiling: bool
    trainer_uid: int  # the training pods' user: TRAINER_UID, or 0 with gemma-tpu:trainerRunsAsRoot
    queue: str | None  # the LocalQueue the run waits in (created suspended, Kueue starts it); None: not queued
    priority_class: str | None  # its WorkloadPriorityClass, with a queue
    max_run_seconds: int | None  # with queued provisioning: how long GKE keeps the run's nodes

    @property
    def multislice(self) -> bool:
        return self.slices > 1

    @property
    def prepared_path(self) -> str:
        return f"{DATA_MOUNT}/{self.prepared_dir}"

    @property
    def prepared_marker(self) -> str:
        return f"{self.prepared_path}/{PREPARED_MARKER_FILE}"

    @property
    def tensorboard_url(self) -> str:
        return f"gs://{self.artifacts_bucket}/{self.run_dir}/tensorboard"


def _email(config: StackConfig, account_id: str) -> str:
    return f"{account_id}@{config.project}.iam.gserviceaccount.com"


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _without_unset(values: dict, *keys: str) -> dict:
    return {key: value for key, value in values.items() if not (key in keys and value is None)}


def prepared_key(run: RunConfig) -> str:
    """The prepared data's directory and preparation Job key. Shards depend only on the corpus (the
    tokenizer is the model family's, see trainer.data.prepare), on how it is read (its format, loss
    mask and bad rows; counted only when not trainer.data.prepare's defaults, so that the prepared data
    of a stack that sets none keeps its directory) and on how a prepared directory records its
    source (PREPARED_SOURCE_RECORD)."""
    identity: dict = {"dataset": run.training.dataset, "source_record": PREPARED_SOURCE_RECORD}
    if run.preparation != PreparationConfig():
        identity["preparation"] = asdict(run.preparation)
    return _digest(identity)[:_PREPARED_HASH_CHARS]


def run_specs(config: StackConfig, *, image: str) -> tuple[RunSpec, ...]:
    """Every run of the stack (gemma-tpu:runs, or the one of gemma-tpu:training), in config order."""
    return tuple(run_spec(config, run, image=image) for run in config.runs)


def run_spec(config: StackConfig, run: RunConfig, *, image: str) -> RunSpec:
    """`run` of `config` with `image`: a change to its training config, the image or its slice
    shape gives a new name, hence a new run with its own checkpoints; no change, the same run.
    Its priority is not part of the name: a queued run's priority can change without a new run."""
    training = run.training
    key = prepared_key(run)
    tpu = replace(config.tpu, slices=run.slices)
    # Other prepared data is another run (the same key as before for the default preparation).
    # fsdp, precision, the local tier and gradient accumulation count only when set, so that runs of stacks that set
    # none keep their names.
    identity = {"training": _without_unset(asdict(training), "fsdp", "precision", "local_checkpoint_interval", "grad_accum_steps"),
                "image": image,
                "tpu": asdict(tpu)}
    if run.preparation != PreparationConfig():
        identity["prepared"] = key
    name = run_object_name(training.run_name, _digest(identity))
    run_dir = f"runs/{name}"
    publish_dir = f"{PUBLISHED_DIR}/{training.run_name}"
    prepared_dir = f"prepared/{key}"
    return RunSpec(
        name=name,
        namespace=config.namespace,
        service_account=config.service_account,
        google_service_account=_email(config, config.training_service_account_id),
        prepare_service_account=config.preparation_service_account,
        prepare_google_service_account=_email(config, config.preparation_service_account_id),
        image=image,
        shape=run_shape(config, run),
        slices=run.slices,
        hosts_per_slice=config.slice.hosts,
        chips_per_host=config.slice.chips_per_host,
        tpu_node_selector=config.tpu_node_selector,
        tpu_node_pools=tpu_node_pools(config),
        exclusive_pools=config.tpu.slices > 1,
        cpu_node_selector={NODE_POOL_LABEL: CPU_POOL_NAME} if config.cluster_mode == "standard" else {},
        data_bucket=config.data_bucket,
        data_cache_gib=config.data_cache_gib,
        pod_disk_gib=config.training_pod_disk_gib,
        trainer_memory_gib=_trainer_memory_gib(config, run),
        local_checkpoint_gib=None if training.local_checkpoint_interval is None else local_tier_gib(training, config.slice),
        multi_tier_backup_minutes=_multi_tier_backup_minutes(config, run),
        multi_tier_node_selector=node_selector(config) if config.multi_tier else None,
        artifacts_bucket=config.artifacts_bucket,
        dataset=training.dataset,
        preparation_flags=tuple(run.preparation.flags()),
        prepared_dir=prepared_dir,
        prepare_name=f"prepare-data-{key}",
        run_dir=run_dir,
        publish_dir=publish_dir,
        trainer_args=_trainer_args(config, run, f"{DATA_MOUNT}/{prepared_dir}", f"{ARTIFACTS_MOUNT}/{run_dir}",
                                   f"{ARTIFACTS_MOUNT}/{publish_dir}"),
        # JAX_PLATFORMS: a TPU that cannot be opened fails the run (trainer.run.mesh) instead of JAX
        # falling back to training on the host's CPU.
        # LIBTPU_INIT_ARGS: XLA's flags for the generation (trainer.run.tpu_flags), as `fit` compiles with them.
        trainer_env={"JAX_PLATFORMS": "tpu", "MEGASCALE_NUM_SLICES": str(run.slices),
                     "LIBTPU_INIT_ARGS": tpu_flags.libtpu_init_args(config.slice.accelerator)},
        max_restarts=training.max_restarts,
        profiling=training.profiling,
        trainer_uid=0 if config.trainer_runs_as_root else TRAINER_UID,
        queue=LOCAL_QUEUE if config.queue.enabled else None,
        priority_class=priority_class_name(run.priority) if config.queue.enabled else None,
        max_run_seconds=FLEX_START_MAX_RUN_SECONDS if config.queued_provisioning else None,
    )


def _multi_tier_backup_minutes(config: StackConfig, run: RunConfig) -> int | None:
    """The run's local tier on GKE's multi-tier checkpointing volume: the replicator's backup interval."""
    if config.multi_tier is None or run.training.local_checkpoint_interval is None:
        return None
    return config.multi_tier.backup_minutes


def _trainer_memory_gib(config: StackConfig, run: RunConfig) -> int | None:
    """The host's bound for the trainer (trainer_memory_gib), less the node's RAM disk where the run's
    local tier is on the multi-tier volume (its pages are the node's, outside the pod)."""
    memory = trainer_memory_gib(config.slice, config.cluster_mode)
    if memory is None or _multi_tier_backup_minutes(config, run) is None:
        return memory
    return memory - in_memory_volume_gib(config)


def _trainer_args(config: StackConfig, run: RunConfig, data_dir: str, run_dir: str, publish_dir: str) -> tuple[str, ...]:
    training = run.training
    args = [
        *trainer_flags(training),
        "--data", data_dir,
        "--workdir", run_dir,
        "--publish-dir", publish_dir,
        "--checkpoint-dir", f"{run_dir}/checkpoints",
        "--tensorboard-dir", f"{run_dir}/tensorboard",
        "--log-format", "json",  # one JSON object a line: the stack's log-based metrics read them
        "--compilation-cache-dir", f"{ARTIFACTS_MOUNT}/{COMPILATION_CACHE_DIR}",
        # FSDP inside a slice (ICI), data parallelism across slices (DCN) and, with gemma-tpu:training.fsdp
        # below the slice's chips, inside it too.
        "--mesh", f"data=-1,fsdp={training.fsdp or config.slice.chips}",
    ]  # fmt: skip
    if config.serving is not None and config.serving.run == run.name and config.serving.parts != (PUBLISHED_MODEL_DIR,):
        args += ["--publish-parts", ",".join(config.serving.parts)]  # what its serving serves (lora: adapter)
    if training.local_checkpoint_interval is not None:
        args += ["--local-checkpoint-dir", LOCAL_CHECKPOINT_MOUNT, "--local-checkpoint-interval", training.local_checkpoint_interval]
        if (minutes := _multi_tier_backup_minutes(config, run)) is not None:
            args += ["--multi-tier-backup-minutes", str(minutes)]
    if training.profiling:
        args += ["--profile-port", str(PROFILE_PORT), "--profile-dir", f"{run_dir}/profile"]
    return tuple(args)
