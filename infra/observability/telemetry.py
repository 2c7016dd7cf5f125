"""The numbers the stack watches and where each comes from: GKE system metrics of the TPU nodes and
the training containers, and the log-based metrics the stack defines on the trainer's JSON report
lines and on the Kubernetes events of the training object. run_telemetry() gathers them once, as
data: the dashboard (infra.observability.dashboard) charts what it is handed, the alerts
(infra.observability.alerts) name their series through here, with Monitoring filters built here.

Pure: config in, names, filters and metric definitions out (infra.observability.monitoring declares them).
"""

from collections.abc import Mapping
from dataclasses import dataclass

from infra.catalog import names
from infra.config import PROJECT, StackConfig
from trainer import contract

# GKE system metrics (cloud.google.com/monitoring/api/metrics_kubernetes; the TPU ones also in GKE's
# TPU monitoring guide, mirrored in google/skills gke-ai-troubleshooting-tpu-metrics-monitoring).
# The TPU runtime metrics need GKE 1.27.4-gke.900+, JAX 0.4.14+ and the container's port 8431
# (workloads.spec.TPU_METRICS_PORT); tensorcore_utilization GKE 1.28.1-gke.1066000+.
NODE_TENSORCORE_UTILIZATION = "kubernetes.io/node/accelerator/tensorcore_utilization"  # %, per chip
NODE_DUTY_CYCLE = "kubernetes.io/node/accelerator/duty_cycle"  # % of time the TensorCores were busy
NODE_HBM_USED = "kubernetes.io/node/accelerator/memory_used"  # bytes, per chip
NODE_HBM_TOTAL = "kubernetes.io/node/accelerator/memory_total"
NODE_ALLOCATABLE_CORES = "kubernetes.io/node/cpu/allocatable_cores"  # one series per node that is up
CONTAINER_DUTY_CYCLE = "kubernetes.io/container/accelerator/duty_cycle"
CONTAINER_RESTARTS = "kubernetes.io/container/restart_count"  # cumulative, per container
CONTAINER_UPTIME = "kubernetes.io/container/uptime"  # one series per running container
K8S_CONTAINER, K8S_NODE, K8S_CLUSTER = "k8s_container", "k8s_node", "k8s_cluster"
USER_METRIC_PREFIX = "logging.googleapis.com/user/"  # a log-based metric's type is this + its name

# GKE's event exporter logs every Kubernetes event (logs/events) with the Event object as jsonPayload;
# events of objects other than pods and nodes, such as Jobs and JobSets, on the k8s_cluster resource
# (GoogleCloudPlatform/k8s-stackdriver event-exporter/sinks/stackdriver).
EVENTS_LOG = "events"


@dataclass(frozen=True, kw_only=True)
class RunEvents:
    """The event reasons the controllers record on a training object of one kind."""

    kind: str
    failed: tuple[str, ...]  # the object failed: the run is over
    restarted: tuple[str, ...]  # another try of the run started
    first_try_counted: int  # how many of `restarted` the first try records too


RUN_EVENTS = {
    # The Job controller records its Failed condition's reason as a Warning event (recordJobFinished,
    # kubernetes pkg/controller/job/job_controller.go) and, through its pod control, "SuccessfulCreate"
    # for every pod it creates (pkg/controller/controller_utils.go): one pod a try.
    "Job": RunEvents(kind="Job", failed=("BackoffLimitExceeded", "PodFailurePolicy", "DeadlineExceeded"),
                     restarted=("SuccessfulCreate",), first_try_counted=1),
    # The JobSet controller records its Failed condition's reason as a Warning event, and an event a
    # restart, counted or not (kubernetes-sigs/jobset pkg/constants, pkg/controllers/failure_policy.go).
    "JobSet": RunEvents(kind="JobSet", failed=("FailJobSetFailurePolicyAction", "ReachedMaxRestarts", "FailedJobs", "DeadlineExceeded"),
                        restarted=("RestartJobSetFailurePolicyAction", "RestartJobSetAndIgnoreMaxRestartsFailurePolicyAction"),
                        first_try_counted=0),
}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class LogMetric:
    """A log-based metric: a counter of the log entries its filter matches or, with a value
    extractor, a distribution of the numbers extracted from them."""

    key: str  # the Pulumi resource's name and the last part of the metric's name
    name: str  # in the project: gemma-tpu/<stack>/<key>
    description: str
    filter: str  # Logging query language
    resource_type: str  # of the entries it counts, hence of its time series
    labels: Mapping[str, str]  # label -> extractor
    series: str  # the Monitoring filter of its time series in the stack's cluster
    value_extractor: str | None = None
    unit: str = "1"

    @property
    def metric_type(self) -> str:
        return USER_METRIC_PREFIX + self.name


@dataclass(frozen=True, kw_only=True)
class NodeSeries:
    """TPU nodes charted together (a node pool, or every node Autopilot makes for the slice shape):
    the Monitoring filters of their per-node series."""

    title: str
    tensorcore_utilization: str
    duty_cycle: str
    hbm_used: str
    hbm_total: str


@dataclass(frozen=True, kw_only=True)
class RunTelemetry:
    """What the stack watches of its runs: the log-based metrics (what the trainer reports, what the
    controllers record) and the GKE series of its trainer containers and TPU nodes."""

    loss: LogMetric
    tokens_per_sec: LogMetric
    step_time: LogMetric
    goodput: LogMetric
    badput: Mapping[str, LogMetric]  # ml-goodput-measurement's category -> the share the trainer reports
    run_events: LogMetric
    events: RunEvents  # of the stack's training object
    container_restarts: str  # filter: every container of the training namespace
    trainer_duty_cycle: str  # filter: the trainer containers' TPU duty cycle
    tpu_nodes: tuple[NodeSeries, ...]  # each group of the stack's TPU nodes

    @property
    def log_metrics(self) -> tuple[LogMetric, ...]:
        return (self.loss, self.tokens_per_sec, self.step_time, self.goodput, *self.badput.values(), self.run_events)


def run_telemetry(config: StackConfig) -> RunTelemetry:
    """What the stack watches of `config`'s runs (every run of the stack's run name)."""
    kind = names.run_kind(slices=config.tpu.slices, hosts_per_slice=config.slice.hosts)
    run_events = _metric_name(config, "run_events")
    return RunTelemetry(
        loss=_reported(config, "loss", "Training loss", "1"),
        tokens_per_sec=_reported(config, "tokens_per_sec", "Training tokens per second (non-padding)", "1/s"),
        step_time=_reported(config, "step_time_s", "Seconds per training step", "s"),
        # The run's goodput so far, all its attempts (trainer.measure.goodput_accounting), and where the rest went.
        goodput=_reported(config, contract.GOODPUT_KEY, "Share of the run's wall time that trained kept steps (goodput)", "1"),
        badput={category: _reported(config, key, f"Share of the run's wall time lost to {category} (badput)", "1")
                for category, key in contract.BADPUT_KEYS.items()},
        run_events=LogMetric(
            key="run_events",
            name=run_events,
            description=f"Kubernetes events of the training {kind}, by reason (created, restarted, failed, completed)",
            filter=_and(
                f'logName = "projects/{config.project}/logs/{EVENTS_LOG}"',
                f'resource.type = "{K8S_CLUSTER}"',
                f'resource.labels.cluster_name = "{config.cluster_name}"',
                f'jsonPayload.involvedObject.kind = "{kind}"',
                f'jsonPayload.involvedObject.namespace = "{config.namespace}"',
                f'jsonPayload.involvedObject.name =~ "^{run_object_pattern(config)}$"',
            ),
            resource_type=K8S_CLUSTER,
            labels={"reason": "EXTRACT(jsonPayload.reason)", "run": "EXTRACT(jsonPayload.involvedObject.name)"},
            series=time_series_filter(USER_METRIC_PREFIX + run_events, K8S_CLUSTER, config),
        ),
        events=RUN_EVENTS[kind],
        container_restarts=time_series_filter(CONTAINER_RESTARTS, K8S_CONTAINER, config, {resource_label("namespace_name"): config.namespace}),
        trainer_duty_cycle=time_series_filter(CONTAINER_DUTY_CYCLE, K8S_CONTAINER, config, trainer_containers(config)),
        tpu_nodes=tuple(node_series(config, title, selectors) for title, selectors in _node_groups(config).items()),
    )


def _node_groups(config: StackConfig) -> dict[str, dict[str, str]]:
    """Title -> selectors of the TPU nodes charted together: each node pool of a Standard cluster,
    or all the nodes Autopilot provisions for the slice shape."""
    if config.cluster_mode == "standard":
        return {pool: {node_label(names.NODE_POOL_LABEL): pool} for pool in names.tpu_pool_names(config.tpu.slices)}
    return {f"TPU nodes ({config.slice.gke_accelerator} {config.slice.topology})": tpu_nodes(config)}


def node_series(config: StackConfig, title: str, selectors: Mapping[str, str]) -> NodeSeries:
    """The series of the nodes `selectors` pick in the stack's cluster (infra.observability.serving_dashboard
    charts the serving pool's too)."""

    def of(metric_type: str) -> str:
        return time_series_filter(metric_type, K8S_NODE, config, selectors)

    return NodeSeries(title=title, tensorcore_utilization=of(NODE_TENSORCORE_UTILIZATION), duty_cycle=of(NODE_DUTY_CYCLE),
                      hbm_used=of(NODE_HBM_USED), hbm_total=of(NODE_HBM_TOTAL))  # fmt: skip


def run_object_pattern(config: StackConfig) -> str:
    """RE2 for the names of the stack's training objects: a run's name and its hash."""
    run_names = "|".join(run.name for run in config.runs)
    return f"(?:{run_names})-[0-9a-f]{{{names.RUN_HASH_CHARS}}}"


def _reported(config: StackConfig, key: str, description: str, unit: str) -> LogMetric:
    """A distribution of one number of the trainer's JSON report lines (trainer.contract)."""
    name = _metric_name(config, key)
    return LogMetric(
        key=key,
        name=name,
        description=description,
        filter=_and(
            f'resource.type = "{K8S_CONTAINER}"',
            f'resource.labels.cluster_name = "{config.cluster_name}"',
            f'resource.labels.namespace_name = "{config.namespace}"',
            f'resource.labels.container_name = "{names.TRAINER_CONTAINER}"',
            f'jsonPayload.{contract.LOG_EVENT_KEY} = "{contract.REPORT_EVENT}"',
            f"jsonPayload.{key}:*",
        ),
        resource_type=K8S_CONTAINER,
        # A run's pods are named after it (<run>-<random> for a Job, <run>-slice-<j>-<p>-<random> for a JobSet).
        labels={"run": f'REGEXP_EXTRACT(resource.labels.pod_name, "^({run_object_pattern(config)})-")'},
        series=time_series_filter(USER_METRIC_PREFIX + name, K8S_CONTAINER, config),
        value_extractor=f"EXTRACT(jsonPayload.{key})",
        unit=unit,
    )


def _metric_name(config: StackConfig, key: str) -> str:
    return f"{PROJECT}/{config.stack}/{key}"


def _and(*terms: str) -> str:
    return " AND ".join(terms)


# Monitoring filters (cloud.google.com/monitoring/api/v3/filters): selectors of a time series.
def resource_label(name: str) -> str:
    return f'resource.label."{name}"'


def metric_label(name: str) -> str:
    return f'metric.label."{name}"'


def node_label(name: str) -> str:
    """A Kubernetes node label, as the k8s_node resource's user metadata."""
    return f'metadata.user_labels."{name}"'


@dataclass(frozen=True)
class OneOf:
    """A selector's value that is any of `values`."""

    values: tuple[str, ...]

    def __str__(self) -> str:
        return "one_of(" + ", ".join(f'"{value}"' for value in self.values) + ")"


def time_series_filter(metric_type: str, resource_type: str, config: StackConfig,
                       selectors: Mapping[str, str | OneOf] | None = None) -> str:
    """The series of `metric_type` on `resource_type` in the stack's cluster that match `selectors`."""
    terms = {"metric.type": metric_type, "resource.type": resource_type, resource_label("cluster_name"): config.cluster_name,
             **(selectors or {})}  # fmt: skip
    return _and(*(f"{selector} = {_value(value)}" for selector, value in terms.items()))


def _value(value: str | OneOf) -> str:
    return str(value) if isinstance(value, OneOf) else f'"{value}"'


def trainer_containers(config: StackConfig) -> dict[str, str]:
    """Selectors of the stack's trainer containers (on k8s_container)."""
    return {resource_label("namespace_name"): config.namespace, resource_label("container_name"): names.TRAINER_CONTAINER}


def tpu_nodes(config: StackConfig) -> dict[str, str]:
    """Selectors of the stack's TPU nodes (on k8s_node), whichever pool or Autopilot made them."""
    return {node_label(label): value for label, value in config.slice.node_selector.items()}
