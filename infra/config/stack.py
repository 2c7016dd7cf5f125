"""StackConfig and parse_stack_config, the one entry point: the top-level keys (gcp:project,
region and zone, the image, the Kubernetes names) and the stack's sections, each read and checked
by its module.

Every key of every section is read, with its type checked, before any unknown key is reported;
only then come the checks that span keys.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra.catalog.tpu import SliceSpec
from infra.config.cluster import (CLUSTER_MODES, ClusterAccess, MultiTierCheckpointing, check_cluster_version, check_multi_tier,
                                  parse_access, parse_multi_tier)
from infra.config.monitoring import MonitoringConfig, parse_monitoring
from infra.config.network import NetworkConfig, check_network_size, parse_network
from infra.config.queue import QueueConfig, check_queue, read_queue
from infra.config.runs import RunConfig, check_run, parse_runs
from infra.config.sections import PROJECT, Section, check_dns_label
from infra.config.serving import ServingConfig, check_serving, read_serving
from infra.config.slices import CAPACITY_SELECTORS, TpuConfig, capacity_chips, check_tpu, parse_tpu
from infra.config.storage import CACHE_HEADROOM_GIB, DATA_CACHE_GIB_DEFAULT, DATA_CACHE_GIB_MAX, TRAINER_SCRATCH_GIB, check_buckets
from infra.config.training import parse_preparation, parse_training
from infra.errors import ConfigError

_PROJECT_ID = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
_REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
# Service account IDs are at most 30 characters: f"gemma-{stack}-nodes" leaves 18 for the stack name.
# Data preparation, the one writer of the data bucket, has its own Google and Kubernetes accounts,
# named with this suffix.
PREPARATION_SUFFIX = "-prep"
_SERVICE_ACCOUNT_SUFFIXES = ("-nodes", "-train", PREPARATION_SUFFIX)
STACK_NAME_MAX = 30 - len("gemma-") - max(len(suffix) for suffix in _SERVICE_ACCOUNT_SUFFIXES)


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
    serving: ServingConfig | None  # gemma-tpu:serving; None: off
    multi_tier: MultiTierCheckpointing | None = None  # gemma-tpu:cluster.multiTierCheckpointing; None: off

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
        capacity = {} if self.queued_provisioning else CAPACITY_SELECTORS[self.tpu.capacity]
        return {**self.slice.node_selector, **capacity}

    @property
    def queued_provisioning(self) -> bool:
        """Flex-start nodes asked for by Kueue when a run is admitted (GKE queued provisioning)."""
        return self.queue.enabled and self.tpu.capacity == "flex-start"

    @property
    def cluster_location(self) -> str:
        """Standard clusters are zonal (compact placement needs one zone); Autopilot is regional."""
        return self.zone if self.cluster_mode == "standard" else self.region


def parse_stack_config(values: Mapping[str, Any], stack: str) -> StackConfig:
    """Validate the `config:` section of `Pulumi.<stack>.yaml` (keys as written there)."""
    check_dns_label("the stack name", stack, STACK_NAME_MAX)
    top = Section("", values)
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
    serving_section = top.section(f"{PROJECT}:serving")

    cluster_mode = cluster.text("mode", "standard", CLUSTER_MODES)
    cluster_version = cluster.text("version", "") or None
    access = parse_access(cluster)
    multi_tier = parse_multi_tier(cluster)
    network_section = top.section(f"{PROJECT}:network")
    network = parse_network(network_section)
    tpu_config = parse_tpu(tpu_section)
    data_bucket = storage.text("dataBucket", "") or f"{project}-{stack}-data"
    artifacts_bucket = storage.text("artifactsBucket", "") or f"{project}-{stack}-artifacts"
    force_destroy = storage.flag("forceDestroy", True)
    keep_artifacts = storage.flag("keepArtifacts", True)
    data_cache_gib = storage.integer("dataCacheGiB", DATA_CACHE_GIB_DEFAULT, minimum=1, maximum=DATA_CACHE_GIB_MAX)
    training = parse_training(training_section)
    preparation = parse_preparation(training_section)
    queue_enabled, tpu_quota = read_queue(queue_section)
    monitoring = parse_monitoring(monitoring_section)
    serving_request = read_serving(serving_section, tpu_config.accelerator)
    for section in (top, cluster, tpu_section, storage, training_section, queue_section, network_section, monitoring_section,
                    serving_section):
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
    slice_spec = check_tpu(tpu_section, tpu_config, cluster_mode)
    if cluster_mode == "standard":
        check_network_size(network_section, network, tpu_pools=tpu_config.slices, hosts_per_pool=slice_spec.hosts)
    check_buckets(storage, data_bucket, artifacts_bucket)
    if any(c.isspace() for c in image):
        raise ConfigError(f"{PROJECT}:image {image!r} is not an image URI; leave it empty to build trainer/")
    check_dns_label(f"{PROJECT}:namespace", namespace, 63)
    check_dns_label(f"{PROJECT}:serviceAccount", service_account, 63 - len(PREPARATION_SUFFIX))
    if cluster_version is not None:
        queued_flex_start = queue_enabled and tpu_config.capacity == "flex-start"
        check_cluster_version(cluster.key("version"), cluster_version, queued_flex_start=queued_flex_start)
    if multi_tier is not None:
        check_multi_tier(cluster, mode=cluster_mode, version=cluster_version, slices=tpu_config.slices)
    if runs_value is None:
        runs = (RunConfig(training=training, preparation=preparation, priority="normal", slices=tpu_config.slices),)
        check_run(training_section, runs[0], tpu_config, slice_spec, name_key="runName", multi_tier=multi_tier is not None)
    else:
        runs = parse_runs(runs_value, training_section, tpu_config, slice_spec, multi_tier=multi_tier is not None)
    if multi_tier is not None and all(run.training.local_checkpoint_interval is None for run in runs):
        raise ConfigError(f"{cluster.key('multiTierCheckpointing')}: no run has a local checkpoint tier to put on its volume; "
                          f"set {training_section.key('localCheckpointInterval')} (auto or steps), or remove the key")
    capacity = capacity_chips(slice_spec, tpu_config.slices)
    queue = QueueConfig(enabled=queue_enabled, tpu_quota=capacity if tpu_quota is None else tpu_quota)
    check_queue(queue_section, queue, runs, slice_spec, capacity,
                queued_provisioning=queue_enabled and tpu_config.capacity == "flex-start", run_list=runs_value is not None)
    serving = check_serving(serving_section, serving_request, runs)
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
        serving=serving,
        multi_tier=multi_tier,
    )
