"""The typed stack configuration: its schema and its validation.

`parse_stack_config` turns the `config:` section of a stack file into a `StackConfig` and validates
it before any resource is declared; infra.stack_files reads that section from a stack file or from
the Pulumi engine. Every problem raises one `ConfigError` whose message names the key as written in
the stack file and the allowed values.
"""

import difflib
import ipaddress
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from infra import names, tpu
from infra.tpu import SliceSpec
from infra.errors import ConfigError
from trainer import chat, formats
from trainer import config as trainer_config  # the trainer's options: their defaults and models

PROJECT = "gemma-tpu"  # the Pulumi project name, the namespace of this program's keys

CLUSTER_MODES = ("standard", "autopilot")
CAPACITIES = ("on-demand", "spot", "reservation", "flex-start")
# Autopilot picks capacity from each pod's node selectors; this project wires on-demand and Spot
# there. Reservations and flex-start need node pool settings, so they are Standard-only here.
CAPACITIES_BY_MODE = {"standard": CAPACITIES, "autopilot": ("on-demand", "spot")}
WEIGHTS = ("official", "random")  # or a gs:// checkpoint
TINYSTORIES_URL = (
    "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/TinyStoriesV2-GPT4-train.txt"
)
# The training pods' cache of the data bucket (prepared TinyStories: about 2 GiB). It sits on the TPU
# node's boot disk (100 GB by default), beside the image.
DATA_CACHE_GIB_DEFAULT = 20
DATA_CACHE_GIB_MAX = 1000
# The cache volume is larger than the cache (the GCS FUSE driver's troubleshooting guide: a cache as
# large as its volume fails with "no space left on device"), and the trainer container has room of
# its own (logs, /tmp) besides; a training pod's ephemeral-storage request covers both, so the
# scheduler and Autopilot give the pod that much disk (and Kueue counts it).
CACHE_HEADROOM_GIB = 1
TRAINER_SCRATCH_GIB = 2
# Kubernetes names (DNS-1123 labels); a run name's limit depends on the names derived from it (infra.names).
_DNS_LABEL = re.compile(r"^[a-z]([a-z0-9-]*[a-z0-9])?$")
_PROJECT_ID = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
_REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
# A reservation in this project, or a shared one of another: projects/OWNER/reservations/NAME.
_RESERVATION = re.compile(r"^(projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/reservations/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
# A Cloud Monitoring notification channel's resource name (`gcloud beta monitoring channels list`).
_NOTIFICATION_CHANNEL = re.compile(r"^projects/[a-z0-9-]+/notificationChannels/[0-9]+$")
# Alert windows: the trainer reports every few steps and GKE samples TPU metrics every 60 s, with a
# few minutes' delay; a shorter window alerts on noise. A condition's duration is at most a day.
ALERT_MINUTES = (5, 24 * 60)
# Service account IDs are at most 30 characters: f"gemma-{stack}-nodes" leaves 18 for the stack name.
# Data preparation, the one writer of the data bucket, has its own Google and Kubernetes accounts,
# named with this suffix.
PREPARATION_SUFFIX = "-prep"
_SERVICE_ACCOUNT_SUFFIXES = ("-nodes", "-train", PREPARATION_SUFFIX)
STACK_NAME_MAX = 30 - len("gemma-") - max(len(suffix) for suffix in _SERVICE_ACCOUNT_SUFFIXES)
# Node labels GKE sets on nodes of each capacity type (and that Autopilot provisions from). A
# reservation has none on a node pool bound to it: `cloud.google.com/reservation-name` is set on
# auto-provisioned and Autopilot nodes only, so reserved pods select their node pools instead.
_CAPACITY_SELECTORS = {
    "on-demand": {},
    "spot": {"cloud.google.com/gke-spot": "true"},
    "flex-start": {"cloud.google.com/gke-flex-start": "true"},
    "reservation": {},
}


# Run priorities (gemma-tpu:runs[].priority): each is a Kueue WorkloadPriorityClass of this value.
# A higher one is admitted first and may preempt a lower one (which resumes from its checkpoint).
PRIORITIES = {"high": 1000, "normal": 100, "low": 10}
# Flex-start TPU nodes through queued provisioning (Kueue's ProvisioningRequest admission check)
# need this GKE version (cloud.google.com/kubernetes-engine/docs/how-to/tpu-flex-start ...).
FLEX_START_QUEUED_MIN_GKE = "1.33.0-gke.1712000"
_GKE_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+)(?:-gke\.(\d+))?)?$")
# Keys an earlier version of this schema had, and where their setting lives now.
MOVED_KEYS = {f"{PROJECT}:cluster.deletionProtection": f"{PROJECT}:protect"}


@dataclass(frozen=True, kw_only=True)
class TpuConfig:
    accelerator: str
    topology: str
    slices: int
    capacity: str
    reservation: str | None


@dataclass(frozen=True, kw_only=True)
class NetworkConfig:
    """The VPC the cluster's nodes live in: the stack's own (`name` None: created with its subnet,
    Cloud Router and NAT) or an existing one, such as a shared VPC, named in config."""

    name: str | None
    subnetwork: str | None
    node_cidr: str  # the stack's own subnet: node addresses
    pod_cidr: str  # its secondary range for pods
    service_cidr: str  # and for services
    pod_range_name: str  # the subnet's secondary range names (an existing subnet's, as named there)
    service_range_name: str

    @property
    def owned(self) -> bool:
        return self.name is None


@dataclass(frozen=True, kw_only=True)
class ClusterAccess:
    """Who reaches the control plane, and when GKE may upgrade the cluster."""

    authorized_networks: tuple[str, ...]  # CIDRs allowed to the IP endpoint; the DNS endpoint is IAM-gated
    maintenance_days: tuple[str, ...]  # weekly recurring maintenance window, in UTC
    maintenance_start_utc: str  # HH:MM
    maintenance_hours: int


@dataclass(frozen=True, kw_only=True)
class MonitoringConfig:
    """The stack's dashboard and alert policies (infra.monitoring); each threshold is an alert's."""

    enabled: bool
    notification_channels: tuple[str, ...]  # where alerts go; none: they show in the console only
    restart_alert_count: int  # a run restarted more than this many times within a day
    low_utilization_percent: float  # a running trainer's TPU duty cycle below this ...
    low_utilization_minutes: int  # ... for this long: stuck or input-bound
    idle_nodes_minutes: int  # TPU nodes up this long with no trainer running


@dataclass(frozen=True, kw_only=True)
class TrainerOption:
    """A `gemma-tpu:training` key that the training pods pass to the trainer as its flag. Its
    default is the trainer's own (trainer.config.TrainConfig), so a new trainer option is one line
    in TRAINER_OPTIONS; docs/stacks.md's table of these keys is generated from it."""

    key: str  # as written in the stack file
    field: str  # of TrainingConfig (the run's hash covers these names: keep them)
    option: str  # of trainer.config.TrainConfig; its flag is --option-with-dashes
    kind: str  # "text", "integer" or "number"
    minimum: float | None = None  # integers
    maximum: float | None = None
    above: float | None = None  # numbers: the value must be above this
    omitted_with: str | None = None  # not passed when this other field is set (the trainer refuses both)
    what: str = ""  # for the docs table

    @property
    def flag(self) -> str:
        return "--" + self.option.replace("_", "-")

    @property
    def default(self) -> Any:
        return getattr(trainer_config.TrainConfig(), self.option)


TRAINER_OPTIONS = (
    TrainerOption(key="model", field="model", option="model", kind="text", what="a Gemma 3 model (tiny is refused: see below)"),
    TrainerOption(key="weights", field="weights", option="weights", kind="text", what="official, random or a gs:// checkpoint"),
    # Gemma 3's shortest context window is 32K tokens.
    TrainerOption(key="seqLen", field="seq_len", option="seq_len", kind="integer", minimum=16, maximum=32768,
                  what="tokens per packed row"),
    TrainerOption(key="batchSize", field="batch_size", option="batch_size", kind="integer", minimum=1,
                  what="global rows a step, divisible by the stack's TPU hosts"),
    TrainerOption(key="steps", field="steps", option="steps", kind="integer", minimum=1, what="training steps; unset: epochs"),
    TrainerOption(key="epochs", field="epochs", option="epochs", kind="integer", minimum=1, omitted_with="steps",
                  what="passes over the data when steps is unset"),
    TrainerOption(key="learningRate", field="learning_rate", option="lr", kind="number", above=0.0, maximum=1.0,
                  what="peak learning rate"),
    TrainerOption(key="loraRank", field="lora_rank", option="lora_rank", kind="integer", minimum=0, maximum=1024,
                  what="LoRA rank; 0 = full fine-tune"),
    TrainerOption(key="checkpointInterval", field="checkpoint_interval", option="checkpoint_interval", kind="integer",
                  minimum=1, what="steps between checkpoints"),
)  # fmt: skip


def stack_models() -> tuple[str, ...]:
    """The trainer's models a stack may train: its Gemma 3 table (not `tiny`, whose tokenizer is
    trained on the demo's own data and which has no official weights)."""
    return tuple(trainer_config.GEMMA3_MODELS)


@dataclass(frozen=True, kw_only=True)
class TrainingConfig:
    model: str
    weights: str
    dataset: str
    seq_len: int
    batch_size: int  # global, over all hosts of all slices
    steps: int | None  # None = run `epochs` epochs
    epochs: int
    learning_rate: float
    lora_rank: int  # 0 = full fine-tune
    checkpoint_interval: int
    max_restarts: int
    profiling: bool
    run_name: str


@dataclass(frozen=True, kw_only=True)
class PreparationConfig:
    """How the preparation Job reads a run's dataset: trainer.prepare's --data-format, --loss-on and
    --on-bad-row, from gemma-tpu:training.dataFormat, lossOn and onBadRow."""

    data_format: str = formats.AUTO  # auto: by the file's extension and first row
    loss_on: str = chat.COMPLETIONS  # chats and prompt/response pairs: train on the model's turns only
    on_bad_row: str = formats.FAIL

    def flags(self) -> list[str]:
        """trainer.prepare's flags (--field-name) for the settings that are not its defaults."""
        defaults = PreparationConfig()
        return [
            arg
            for field in fields(self)
            if getattr(self, field.name) != getattr(defaults, field.name)
            for arg in ("--" + field.name.replace("_", "-"), getattr(self, field.name))
        ]


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One training run on the stack's TPUs: its settings, its priority in the queue and how many
    of the stack's slices it takes."""

    training: TrainingConfig
    preparation: PreparationConfig
    priority: str  # a key of PRIORITIES
    slices: int  # at most the stack's gemma-tpu:tpu.slices

    @property
    def name(self) -> str:
        return self.training.run_name


@dataclass(frozen=True, kw_only=True)
class QueueConfig:
    """Kueue in front of the TPUs: runs wait in a queue whose TPU quota is the pools' capacity."""

    enabled: bool
    tpu_quota: int  # google.com/tpu chips the queue admits at once; the pools' capacity by default


@dataclass(frozen=True, kw_only=True)
class StackConfig:
    stack: str
    project: str
    region: str
    zone: str
    cluster_mode: str  # "standard" | "autopilot"
    network: NetworkConfig
    access: ClusterAccess
    tpu: TpuConfig
    slice: SliceSpec  # derived from tpu.accelerator + tpu.topology
    data_bucket: str
    artifacts_bucket: str
    force_destroy: bool  # buckets that `pulumi destroy` deletes go with their contents
    keep_artifacts: bool  # `pulumi destroy` leaves the artifacts bucket (checkpoints) in place
    data_cache_gib: int  # each training pod's file cache of the data bucket, on its node's disk
    image: str | None  # None = build trainer/ into the stack's registry
    namespace: str
    service_account: str  # the Kubernetes ServiceAccount the training pods run as
    protect: bool  # GKE deletion protection and Pulumi `protect` on the cluster, buckets and registry
    # The fallback if the TPU device files are not readable by the image's non-root user (docs/workloads.md).
    trainer_runs_as_root: bool
    cluster_version: str | None  # the control plane's minimum GKE version; None: the channel's default
    runs: tuple[RunConfig, ...]  # gemma-tpu:runs, or the one run of gemma-tpu:training
    run_list: bool  # the runs come from gemma-tpu:runs
    queue: QueueConfig
    monitoring: MonitoringConfig

    @property
    def cluster_name(self) -> str:
        return f"gemma-{self.stack}"

    @property
    def node_service_account_id(self) -> str:
        return f"{self.cluster_name}{_SERVICE_ACCOUNT_SUFFIXES[0]}"

    @property
    def training_service_account_id(self) -> str:
        return f"{self.cluster_name}{_SERVICE_ACCOUNT_SUFFIXES[1]}"

    @property
    def preparation_service_account_id(self) -> str:
        return f"{self.cluster_name}{PREPARATION_SUFFIX}"

    @property
    def preparation_service_account(self) -> str:
        """The Kubernetes ServiceAccount the data preparation pods run as."""
        return f"{self.service_account}{PREPARATION_SUFFIX}"

    @property
    def workload_identity_pool(self) -> str:
        return f"{self.project}.svc.id.goog"

    @property
    def total_hosts(self) -> int:
        """Hosts over all slices: the number of training processes."""
        return self.slice.hosts * self.tpu.slices

    @property
    def training_pod_disk_gib(self) -> int:
        """Each training pod's ephemeral-storage request: the data cache's volume and the trainer's room."""
        return self.data_cache_gib + CACHE_HEADROOM_GIB + TRAINER_SCRATCH_GIB

    @property
    def tpu_node_selector(self) -> dict[str, str]:
        """The node labels a training pod selects: the slice's shape and the capacity type. Queued
        provisioning pools are flex-start pools of their own, which the pods select by name (GKE's
        queued provisioning examples do), not by a capacity label."""
        capacity = {} if self.queued_provisioning else _CAPACITY_SELECTORS[self.tpu.capacity]
        return {**self.slice.node_selector, **capacity}

    @property
    def queued_provisioning(self) -> bool:
        """Flex-start nodes asked for by Kueue when a run is admitted (GKE queued provisioning)."""
        return self.queue.enabled and self.tpu.capacity == "flex-start"

    @property
    def cluster_location(self) -> str:
        """Standard clusters are zonal (compact placement needs one zone); Autopilot is regional."""
        return self.zone if self.cluster_mode == "standard" else self.region


def capacity_chips(slice_spec: SliceSpec, slices: int) -> int:
    """TPU chips `slices` slices of the shape hold: what a run of them requests, and a pool set's capacity."""
    return slice_spec.chips * slices


class _Section:
    """Typed reads from one mapping of the stack file, remembering which keys were read so that
    the rest can be reported as unknown."""

    def __init__(self, key: str, values: Any):
        if values is None:
            values = {}
        if not isinstance(values, Mapping):
            raise ConfigError(f"{key} must be a mapping of keys to values, got {values!r}")
        self._prefix = f"{key}." if key else ""
        self._values = values
        self._known: list[str] = []

    def key(self, name: str) -> str:
        return f"{self._prefix}{name}"

    def _get(self, name: str, default: Any) -> Any:
        self._known.append(name)
        value = self._values.get(name)
        return default if value is None else value

    def text(self, name: str, default: str, choices: tuple[str, ...] = ()) -> str:
        value = self._get(name, default)
        if not isinstance(value, str):
            raise ConfigError(f"{self.key(name)} must be a string, got {value!r}")
        if choices and value not in choices:
            raise ConfigError(f"{self.key(name)} is {value!r}; choose one of {', '.join(choices)}")
        return value

    def integer(self, name: str, default: int | None, minimum: int, maximum: int | None = None) -> int | None:
        value = self._get(name, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{self.key(name)} must be an integer, got {value!r}")
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
            raise ConfigError(f"{self.key(name)} is {value}; it must be {bound}")
        return value

    def number(self, name: str, default: float, above: float, maximum: float) -> float:
        value = self._get(name, default)
        # `pulumi config set --path` stores 2e-5 as the string "2e-5" (it converts only ints and bools).
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{self.key(name)} must be a number, got {value!r}")
        if not above < value <= maximum:
            raise ConfigError(f"{self.key(name)} is {value}; it must be above {above} and at most {maximum}")
        return float(value)

    def text_list(self, name: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self._get(name, default)
        if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
            raise ConfigError(f"{self.key(name)} must be a list of strings, got {value!r}")
        return tuple(value)

    def flag(self, name: str, default: bool) -> bool:
        value = self._get(name, default)
        # The engine passes top-level values as text, and `pulumi config set KEY true` stores "true".
        value = {"true": True, "false": False}.get(value, value) if isinstance(value, str) else value
        if not isinstance(value, bool):
            raise ConfigError(f"{self.key(name)} must be true or false, got {value!r}")
        return value

    def written(self) -> dict[str, Any]:
        """The section's keys and values as written in the stack file."""
        return dict(self._values)

    def raw(self, name: str) -> Any:
        """The value as written (None when unset), for values that are neither scalars nor mappings."""
        return self._get(name, None)

    def section(self, name: str) -> "_Section":
        return _Section(self.key(name), self._get(name, None))

    def reject_unknown(self) -> None:
        for name in map(str, self._values):  # YAML may give a key such as `1:` as a number
            if name in self._known:
                continue
            key = self.key(name)
            if key in MOVED_KEYS:
                raise ConfigError(f"{key} is now {MOVED_KEYS[key]}; set that key instead and remove this one")
            section = name.split(".")[0]
            if section in self._known:
                raise ConfigError(
                    f"{key} is not a known key; to set a key inside {section}, run "
                    f"`pulumi config set --path '{name}' VALUE`"
                )
            raise ConfigError(f"{key} is not a known key{self._suggestion(name)}; the keys here are {', '.join(self._known)}")

    def _suggestion(self, name: str) -> str:
        """` (did you mean X?)` for a misspelt key or one written without its `gemma-tpu:` namespace."""
        namespaced = [known for known in self._known if known.split(":")[-1] == name]
        close = namespaced or difflib.get_close_matches(name, self._known, n=1)
        return f" (did you mean {close[0]}?)" if close else ""


def parse_stack_config(values: Mapping[str, Any], stack: str) -> StackConfig:
    """Validate the `config:` section of `Pulumi.<stack>.yaml` (keys as written there)."""
    _check_dns_label("the stack name", stack, STACK_NAME_MAX)
    top = _Section("", values)
    project = top.text("gcp:project", "")
    region = top.text("gcp:region", "us-east5")
    zone = top.text("gcp:zone", f"{region}-b")
    cluster = top.section(f"{PROJECT}:cluster")
    tpu_section = top.section(f"{PROJECT}:tpu")
    storage = top.section(f"{PROJECT}:storage")
    image = top.text(f"{PROJECT}:image", "")
    namespace = top.text(f"{PROJECT}:namespace", "training")
    service_account = top.text(f"{PROJECT}:serviceAccount", "trainer")
    protect = top.flag(f"{PROJECT}:protect", False)
    trainer_runs_as_root = top.flag(f"{PROJECT}:trainerRunsAsRoot", False)
    training_section = top.section(f"{PROJECT}:training")
    runs_value = top.raw(f"{PROJECT}:runs")
    queue_section = top.section(f"{PROJECT}:queue")
    monitoring_section = top.section(f"{PROJECT}:monitoring")

    cluster_mode = cluster.text("mode", "standard", CLUSTER_MODES)
    cluster_version = cluster.text("version", "") or None
    access = _parse_access(cluster)
    network_section = top.section(f"{PROJECT}:network")
    network = _parse_network(network_section)
    tpu_config = TpuConfig(
        accelerator=tpu_section.text("accelerator", "v6e", tpu.ACCELERATORS),
        topology=tpu_section.text("topology", "1x1"),
        slices=tpu_section.integer("slices", 1, minimum=1),
        capacity=tpu_section.text("capacity", "on-demand", CAPACITIES),
        reservation=tpu_section.text("reservation", "") or None,
    )
    data_bucket = storage.text("dataBucket", "") or f"{project}-{stack}-data"
    artifacts_bucket = storage.text("artifactsBucket", "") or f"{project}-{stack}-artifacts"
    force_destroy = storage.flag("forceDestroy", True)
    keep_artifacts = storage.flag("keepArtifacts", True)
    data_cache_gib = storage.integer("dataCacheGiB", DATA_CACHE_GIB_DEFAULT, minimum=1, maximum=DATA_CACHE_GIB_MAX)
    training = _parse_training(training_section)
    preparation = _parse_preparation(training_section)
    queue_enabled = queue_section.flag("enabled", False)
    tpu_quota = queue_section.integer("tpuQuota", None, minimum=1)
    monitoring = _parse_monitoring(monitoring_section)
    for section in (top, cluster, tpu_section, storage, training_section, queue_section, network_section, monitoring_section):
        section.reject_unknown()

    # Values are well-typed and every key is known: now the checks that span keys.
    if not project:
        raise ConfigError("gcp:project is required: run `pulumi config set gcp:project YOUR_PROJECT_ID`")
    if not _PROJECT_ID.match(project):
        raise ConfigError(f"gcp:project {project!r} is not a Google Cloud project ID (6-30 of a-z, 0-9, -)")
    if not _REGION.match(region):
        raise ConfigError(f"gcp:region {region!r} is not a region name such as us-east5")
    if not re.fullmatch(rf"{re.escape(region)}-[a-z]", zone):
        raise ConfigError(f"gcp:zone {zone!r} is not in gcp:region {region!r}; use a zone such as {region}-b")
    try:
        slice_spec = tpu.slice_spec(tpu_config.accelerator, tpu_config.topology)
    except ConfigError as error:
        raise ConfigError(f"{tpu_section.key('topology')}: {error}") from None
    _check_tpu(tpu_section, tpu_config, slice_spec, cluster_mode)
    for key, bucket in ((storage.key("dataBucket"), data_bucket), (storage.key("artifactsBucket"), artifacts_bucket)):
        _check_bucket(key, bucket)
    if data_bucket == artifacts_bucket:
        raise ConfigError(f"{storage.key('artifactsBucket')} must differ from {storage.key('dataBucket')}")
    if any(c.isspace() for c in image):
        raise ConfigError(f"{PROJECT}:image {image!r} is not an image URI; leave it empty to build trainer/")
    _check_dns_label(f"{PROJECT}:namespace", namespace, 63)
    _check_dns_label(f"{PROJECT}:serviceAccount", service_account, 63 - len(PREPARATION_SUFFIX))
    if cluster_version is not None:
        _check_cluster_version(cluster.key("version"), cluster_version, tpu_config, queue_enabled)
    if runs_value is None:
        runs = (RunConfig(training=training, preparation=preparation, priority="normal", slices=tpu_config.slices),)
        _check_run(training_section, runs[0], tpu_config, slice_spec, name_key="runName")
    else:
        runs = _parse_runs(runs_value, training_section, tpu_config, slice_spec)
    capacity = capacity_chips(slice_spec, tpu_config.slices)
    queue = QueueConfig(enabled=queue_enabled, tpu_quota=capacity if tpu_quota is None else tpu_quota)
    _check_queue(queue_section, queue, runs, slice_spec, capacity)
    return StackConfig(
        stack=stack,
        project=project,
        region=region,
        zone=zone,
        cluster_mode=cluster_mode,
        network=network,
        access=access,
        tpu=tpu_config,
        slice=slice_spec,
        data_bucket=data_bucket,
        artifacts_bucket=artifacts_bucket,
        force_destroy=force_destroy,
        keep_artifacts=keep_artifacts,
        data_cache_gib=data_cache_gib,
        image=image or None,
        namespace=namespace,
        service_account=service_account,
        protect=protect,
        trainer_runs_as_root=trainer_runs_as_root,
        cluster_version=cluster_version,
        runs=runs,
        run_list=runs_value is not None,
        queue=queue,
        monitoring=monitoring,
    )


def _parse_runs(value: Any, training_section: _Section, tpu_config: TpuConfig, slice_spec: SliceSpec) -> tuple[RunConfig, ...]:
    """gemma-tpu:runs: a list of runs, each the gemma-tpu:training settings (already checked) with
    its own keys over them."""
    key = f"{PROJECT}:runs"
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f"{key} must be a list of runs, each a mapping with a name, got {value!r}")
    shared = training_section.written()
    if "runName" in shared:
        raise ConfigError(
            f"{training_section.key('runName')} names the single run of a stack without {key}; "
            f"with {key}, give each run its name there (name: ...) and remove runName"
        )
    runs, seen = [], {}
    for index, run_values in enumerate(value):
        if not isinstance(run_values, Mapping):
            raise ConfigError(f"{key}[{index}] must be a mapping of a run's keys (name, priority, training keys), got {run_values!r}")
        section = _Section(f"{key}[{index}]", {**shared, **run_values})
        if not section.text("name", ""):
            raise ConfigError(f"{section.key('name')} is required: give the run a name (a-z, 0-9, -)")
        for name, stack_value in (("accelerator", tpu_config.accelerator), ("topology", tpu_config.topology)):
            asked = section.text(name, stack_value)
            if asked != stack_value:
                raise ConfigError(
                    f"{section.key(name)} is {asked!r}, but the stack's TPU pools are {tpu_config.accelerator} "
                    f"{tpu_config.topology} ({PROJECT}:tpu); run it on a stack with such pools or remove the key"
                )
        run = RunConfig(
            training=_parse_training(section, name_key="name"),
            preparation=_parse_preparation(section),
            priority=section.text("priority", "normal", tuple(PRIORITIES)),
            slices=section.integer("slices", tpu_config.slices, minimum=1, maximum=tpu_config.slices),
        )
        section.reject_unknown()
        if run.name in seen:
            raise ConfigError(f"{section.key('name')} {run.name!r} is also {key}[{seen[run.name]}].name; give each run its own name")
        seen[run.name] = index
        _check_run(section, run, tpu_config, slice_spec, name_key="name")
        runs.append(run)
    return tuple(runs)


def _check_run(section: _Section, run: RunConfig, tpu_config: TpuConfig, slice_spec: SliceSpec, *, name_key: str) -> None:
    run_tpu = replace(tpu_config, slices=run.slices)
    _check_run_name(section.key(name_key), run.name, run_tpu, slice_spec)
    hosts = slice_spec.hosts * run.slices
    if run.training.batch_size % hosts:
        raise ConfigError(
            f"{section.key('batchSize')} is {run.training.batch_size}; it must be divisible by the "
            f"{hosts} hosts of {run.slices} x {slice_spec.topology} slices (each host loads an equal share)"
        )


def _check_queue(section: _Section, queue: QueueConfig, runs: tuple[RunConfig, ...], slice_spec: SliceSpec, capacity: int) -> None:
    if len(runs) > 1 and not queue.enabled:
        raise ConfigError(
            f"{PROJECT}:runs holds {len(runs)} runs on one set of TPU pools; set {section.key('enabled')} true so that "
            "Kueue admits them in turn (each whole or not at all)"
        )
    if queue.tpu_quota > capacity:
        raise ConfigError(
            f"{section.key('tpuQuota')} is {queue.tpu_quota} chips, over the {capacity} chips the stack's TPU pools hold; "
            f"set at most {capacity} (or leave it unset: the pools' capacity)"
        )
    for run in runs:
        needs = capacity_chips(slice_spec, run.slices)
        if needs > queue.tpu_quota:
            raise ConfigError(
                f"{section.key('tpuQuota')} is {queue.tpu_quota} chips, but run {run.name!r} needs {needs} "
                f"({run.slices} x {slice_spec.topology}) and would never be admitted; raise the quota or give the run fewer slices"
            )


def _gke_version(text: str) -> tuple[int, ...] | None:
    match = _GKE_VERSION.match(text)
    return None if match is None else tuple(int(part) for part in match.groups() if part is not None)


def _check_cluster_version(key: str, version: str, tpu_config: TpuConfig, queue_enabled: bool) -> None:
    parsed = _gke_version(version)
    if parsed is None:
        raise ConfigError(f"{key} is {version!r}; give a GKE version such as 1.33 or 1.33.5-gke.1080000 (or leave it unset)")
    if queue_enabled and tpu_config.capacity == "flex-start":
        floor = _gke_version(FLEX_START_QUEUED_MIN_GKE)
        # A shorter version (1.33) is any release of it: compare the parts it gives.
        if parsed < floor[: len(parsed)]:
            raise ConfigError(
                f"{key} is {version}, but flex-start TPU nodes through Kueue's queued provisioning need GKE "
                f"{FLEX_START_QUEUED_MIN_GKE} or later; raise it or leave it unset (the release channel's default)"
            )


def _parse_training(section: _Section, *, name_key: str = "runName") -> TrainingConfig:
    by_key = {option.key: option for option in TRAINER_OPTIONS}
    weights = _read_option(section, by_key["weights"])
    if weights not in WEIGHTS and not weights.startswith("gs://"):
        raise ConfigError(f"{section.key('weights')} is {weights!r}; choose one of {', '.join(WEIGHTS)} or a gs:// checkpoint")
    dataset = section.text("dataset", TINYSTORIES_URL)
    if not dataset.startswith(("https://", "gs://")):
        raise ConfigError(f"{section.key('dataset')} is {dataset!r}; give an https:// URL or a gs:// path")
    values = {option.field: _read_option(section, option) for option in TRAINER_OPTIONS if option.key != "weights"}
    if values["model"] == trainer_config.TINY:
        raise ConfigError(
            f"{section.key('model')} is {trainer_config.TINY!r}, the trainer's local CPU demo model, whose tokenizer is "
            f"trained on the demo's own data; choose one of {', '.join(stack_models())} (run the demo with `make demo`)"
        )
    if values["model"] not in stack_models():
        raise ConfigError(f"{section.key('model')} is {values['model']!r}; choose one of {', '.join(stack_models())}")
    return TrainingConfig(
        **values,
        weights=weights,
        dataset=dataset,
        max_restarts=section.integer("maxRestarts", 10, minimum=0),
        profiling=section.flag("profiling", False),
        run_name=section.text(name_key, "gemma-finetune"),
    )


def _parse_preparation(section: _Section) -> PreparationConfig:
    default = PreparationConfig()
    return PreparationConfig(
        data_format=section.text("dataFormat", default.data_format, formats.DATA_FORMATS),
        loss_on=section.text("lossOn", default.loss_on, chat.LOSS_ON),
        on_bad_row=section.text("onBadRow", default.on_bad_row, formats.ON_BAD_ROW),
    )


def _parse_monitoring(section: _Section) -> MonitoringConfig:
    enabled = section.flag("enabled", True)
    channels = section.text_list("notificationChannels", ())
    for channel in channels:
        if not _NOTIFICATION_CHANNEL.match(channel):
            raise ConfigError(
                f"{section.key('notificationChannels')} holds {channel!r}, not a channel such as "
                "projects/PROJECT/notificationChannels/123; list yours with `gcloud beta monitoring channels list`"
            )
    minutes = {"minimum": ALERT_MINUTES[0], "maximum": ALERT_MINUTES[1]}
    return MonitoringConfig(
        enabled=enabled,
        notification_channels=channels,
        restart_alert_count=section.integer("restartAlertCount", 3, minimum=0),
        low_utilization_percent=section.number("lowUtilizationPercent", 20.0, above=0.0, maximum=100.0),
        low_utilization_minutes=section.integer("lowUtilizationMinutes", 30, **minutes),
        idle_nodes_minutes=section.integer("idleNodesMinutes", 30, **minutes),
    )


def _read_option(section: _Section, option: TrainerOption) -> Any:
    if option.kind == "integer":
        return section.integer(option.key, option.default, minimum=option.minimum, maximum=option.maximum)
    if option.kind == "number":
        return section.number(option.key, option.default, above=option.above, maximum=option.maximum)
    return section.text(option.key, option.default)


def trainer_flags(training: TrainingConfig) -> list[str]:
    """The trainer flags of the stack's training settings, in TRAINER_OPTIONS order."""
    flags = []
    for option in TRAINER_OPTIONS:
        value = getattr(training, option.field)
        if value is None or (option.omitted_with and getattr(training, option.omitted_with) is not None):
            continue
        flags += [option.flag, repr(value) if option.kind == "number" else str(value)]
    return flags


# The stack's own subnet: nodes, and its secondary ranges for pods (a /14: GKE gives each node a /24)
# and services. Private (RFC 1918) and disjoint; override them to fit a peered network.
DEFAULT_NODE_CIDR = "10.0.0.0/20"
DEFAULT_POD_CIDR = "10.4.0.0/14"
DEFAULT_SERVICE_CIDR = "10.8.0.0/20"
_DAYS = ("MO", "TU", "WE", "TH", "FR", "SA", "SU")
# GKE needs a maintenance window with at least 48 hours of availability in any 32 days (every
# weekday occurs at least 4 times in 32 days) and each occurrence at least 4 hours long.
_MAINTENANCE_HOURS_IN_32_DAYS = 48
_MAINTENANCE_HOURS_MIN = 4


def _parse_network(section: _Section) -> NetworkConfig:
    name = section.text("name", "") or None
    subnetwork = section.text("subnetwork", "") or None
    cidrs = {key: section.text(key, default) for key, default in
             (("nodeCidr", DEFAULT_NODE_CIDR), ("podCidr", DEFAULT_POD_CIDR), ("serviceCidr", DEFAULT_SERVICE_CIDR))}  # fmt: skip
    pod_range = section.text("podRangeName", "")
    service_range = section.text("serviceRangeName", "")
    if (name is None) != (subnetwork is None):
        raise ConfigError(
            f"{section.key('name')} and {section.key('subnetwork')} go together: name an existing network and its "
            "subnetwork, or leave both empty for the stack's own network"
        )
    if name is None:
        if pod_range or service_range:
            raise ConfigError(f"{section.key('podRangeName')} and {section.key('serviceRangeName')} name an existing "
                              f"subnetwork's ranges; set {section.key('name')} and {section.key('subnetwork')} too, or remove them")
        _check_cidrs(section, cidrs)
        return NetworkConfig(name=None, subnetwork=None, node_cidr=cidrs["nodeCidr"], pod_cidr=cidrs["podCidr"],
                             service_cidr=cidrs["serviceCidr"], pod_range_name="pods", service_range_name="services")  # fmt: skip
    if name == "default":
        raise ConfigError(f"{section.key('name')} is 'default', the project's auto-mode network with open firewall "
                          "rules; leave it empty for the stack's own network or name a network made for the cluster")
    if not (pod_range and service_range):
        raise ConfigError(f"{section.key('podRangeName')} and {section.key('serviceRangeName')} are required with an "
                          f"existing network: the secondary ranges of {subnetwork} for pods and services")
    return NetworkConfig(name=name, subnetwork=subnetwork, node_cidr="", pod_cidr="", service_cidr="",
                         pod_range_name=pod_range, service_range_name=service_range)  # fmt: skip


def _check_cidrs(section: _Section, cidrs: dict[str, str]) -> None:
    networks = {}
    for key, text in cidrs.items():
        try:
            network = ipaddress.ip_network(text)
        except ValueError:
            raise ConfigError(f"{section.key(key)} is {text!r}, not an IPv4 range such as 10.0.0.0/20") from None
        if network.version != 4 or not network.is_private:
            raise ConfigError(f"{section.key(key)} is {text!r}; use a private IPv4 range (10/8, 172.16/12, 192.168/16)")
        networks[key] = network
    for (key_a, a), (key_b, b) in itertools.combinations(networks.items(), 2):
        if a.overlaps(b):
            raise ConfigError(f"{section.key(key_a)} {a} overlaps {section.key(key_b)} {b}; give them disjoint ranges")


def _parse_access(section: _Section) -> ClusterAccess:
    authorized = section.text_list("authorizedNetworks", ())
    for cidr in authorized:
        try:
            network = ipaddress.ip_network(cidr)
        except ValueError:
            raise ConfigError(f"{section.key('authorizedNetworks')} holds {cidr!r}, not a CIDR range such as 203.0.113.0/24") from None
        if network.prefixlen == 0:
            raise ConfigError(f"{section.key('authorizedNetworks')} holds {cidr}, which opens the control plane to the "
                              "internet; list your own ranges (kubectl and pulumi also reach it through its DNS endpoint)")
    days = section.text_list("maintenanceDays", ("SA", "SU"))
    start = section.text("maintenanceStartUtc", "02:00")
    hours = section.integer("maintenanceHours", 6, minimum=_MAINTENANCE_HOURS_MIN, maximum=24)
    unknown = [day for day in days if day not in _DAYS]
    if unknown or not days or len(set(days)) != len(days):
        raise ConfigError(f"{section.key('maintenanceDays')} is {list(days)}; give distinct days among {', '.join(_DAYS)}")
    if not re.fullmatch(r"([01][0-9]|2[0-3]):[0-5][0-9]", start):
        raise ConfigError(f"{section.key('maintenanceStartUtc')} is {start!r}; give a time of day in UTC such as 02:00")
    if 4 * len(days) * hours < _MAINTENANCE_HOURS_IN_32_DAYS:
        raise ConfigError(
            f"{section.key('maintenanceDays')} x {section.key('maintenanceHours')} gives {4 * len(days) * hours} hours in "
            f"32 days; GKE needs at least {_MAINTENANCE_HOURS_IN_32_DAYS}: add days or hours"
        )
    return ClusterAccess(authorized_networks=authorized, maintenance_days=days, maintenance_start_utc=start,
                         maintenance_hours=hours)  # fmt: skip


def _check_tpu(section: _Section, config: TpuConfig, slice_spec: SliceSpec, cluster_mode: str) -> None:
    if config.slices > 1 and not slice_spec.multi_host:
        multi_host = [s.topology for s in tpu.catalog() if s.accelerator == config.accelerator and s.multi_host]
        raise ConfigError(
            f"{section.key('slices')} is {config.slices} but {config.accelerator} {config.topology} is a single-host "
            f"slice; multislice needs a multi-host topology ({', '.join(multi_host)}) or slices: 1"
        )
    allowed = CAPACITIES_BY_MODE[cluster_mode]
    if config.capacity not in allowed:
        raise ConfigError(
            f"{section.key('capacity')} {config.capacity!r} is not supported with {PROJECT}:cluster.mode "
            f"{cluster_mode}; choose one of {', '.join(allowed)}"
        )
    if config.capacity == "reservation" and not config.reservation:
        raise ConfigError(f"{section.key('reservation')} is required with capacity: reservation; give the reservation's name")
    if config.reservation and not _RESERVATION.match(config.reservation):
        raise ConfigError(
            f"{section.key('reservation')} {config.reservation!r} is not a reservation; give its name (such as "
            "my-tpus) or, for a reservation shared from another project, projects/OWNER_PROJECT/reservations/NAME"
        )
    if config.reservation and config.capacity != "reservation":
        raise ConfigError(
            f"{section.key('reservation')} is set but {section.key('capacity')} is {config.capacity!r}; "
            "set capacity: reservation or remove the reservation"
        )


def _check_run_name(key: str, run_name: str, config: TpuConfig, slice_spec: SliceSpec) -> None:
    """The Job / JobSet, pod and coordinator names derived from the run name must be DNS labels, or
    Kubernetes or the JobSet webhook refuses the training object on `pulumi up`."""
    shape = {"slices": config.slices, "hosts_per_slice": slice_spec.hosts}
    limit = names.run_name_max(**shape)
    if not _DNS_LABEL.match(run_name):
        _check_dns_label(key, run_name, limit)
    over = names.too_long(names.generated_names(run_name, **shape))
    if over:
        what, name = next(iter(over.items()))
        slices = f"{config.slices} slice{'s' if config.slices > 1 else ''} of {config.accelerator} {config.topology}"
        raise ConfigError(
            f"{key} {run_name!r} is too long for {slices}: the {what} would be {name!r} (x: the run's hash), "
            f"{len(name)} characters, and Kubernetes allows {names.DNS_LABEL_MAX}; use at most {limit} characters"
        )


def _check_bucket(key: str, bucket: str) -> None:
    if not _BUCKET.match(bucket) or "google" in bucket or bucket.startswith("goog"):
        raise ConfigError(
            f"{key}: {bucket!r} is not a valid bucket name (3-63 of a-z, 0-9, '-', '_', '.', "
            "no 'google'); set a valid name there"
        )


def _check_dns_label(key: str, value: str, max_length: int) -> None:
    if len(value) > max_length or not _DNS_LABEL.match(value):
        raise ConfigError(
            f"{key} {value!r} must be at most {max_length} characters of a-z, 0-9 and '-', starting with a letter"
        )
