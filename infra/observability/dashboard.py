"""The stack's Cloud Monitoring dashboard as a function of its config: the run (loss, tokens/s, step
time, the training object's events, container restarts, the trainer's TPU duty cycle), then each TPU
node pool (TensorCore utilization, duty cycle, HBM). The JSON is the Dashboards API's `Dashboard`
(cloud.google.com/monitoring/api/ref_v3/rest/v1/projects.dashboards)."""

from collections.abc import Iterable, Mapping

from infra.observability import telemetry
from infra.config import StackConfig
from infra.catalog.names import NODE_POOL_LABEL, tpu_pool_names
from infra.observability.telemetry import K8S_CONTAINER, K8S_NODE, LogMetric, RunTelemetry, metric_label, node_label, resource_label

COLUMNS = 12
TILE_WIDTH, TILE_HEIGHT = 4, 4  # three charts a row
ALIGNMENT = "60s"  # GKE samples its metrics every 60 s


def dashboard(config: StackConfig, run: RunTelemetry, more_charts: Iterable[dict] = ()) -> dict:
    """The run's charts, each TPU node group's, then `more_charts`: the rows other parts of the
    stack add from this module's chart builders (infra.observability.serving_dashboard), which infra.observability.monitoring
    joins, so that this module imports none of them."""
    charts = _run_charts(config, run)
    for group, selectors in node_groups(config).items():
        charts += _node_charts(config, group, selectors)
    charts += more_charts
    return {"displayName": f"gemma-tpu {config.stack}", "mosaicLayout": {"columns": COLUMNS, "tiles": _tiles(charts)}}


def node_groups(config: StackConfig) -> dict[str, dict[str, str]]:
    """Title -> selectors of the TPU nodes charted together: each node pool of a Standard cluster,
    or all the nodes Autopilot provisions for the slice shape."""
    if config.cluster_mode == "standard":
        return {pool: {node_label(NODE_POOL_LABEL): pool} for pool in tpu_pool_names(config.tpu.slices)}
    return {f"TPU nodes ({config.slice.gke_accelerator} {config.slice.topology})": telemetry.tpu_nodes(config)}


def _run_charts(config: StackConfig, run: RunTelemetry) -> list[dict]:
    by_run = (metric_label("run"),)
    restarts = telemetry.time_series_filter(telemetry.CONTAINER_RESTARTS, K8S_CONTAINER, config,
                                            {resource_label("namespace_name"): config.namespace})  # fmt: skip
    duty_cycle = telemetry.time_series_filter(telemetry.CONTAINER_DUTY_CYCLE, K8S_CONTAINER, config,
                                              telemetry.trainer_containers(config))  # fmt: skip
    return [
        _chart("Loss", [_reported(config, run.loss, by_run)], "loss"),
        _chart("Tokens per second", [_reported(config, run.tokens_per_sec, by_run)], "tokens/s"),
        _chart("Seconds per step", [_reported(config, run.step_time, by_run)], "s"),
        _chart(f"Run events of the {run.events.kind}, by reason",
               [_series(telemetry.log_metric_filter(run.run_events, config), "ALIGN_SUM", "REDUCE_SUM",
                        (metric_label("reason"),), plot="STACKED_BAR")], "events"),  # fmt: skip
        _chart("Container restarts in the training namespace",
               [_series(restarts, "ALIGN_DELTA", "REDUCE_SUM", (resource_label("pod_name"), resource_label("container_name")),
                        plot="STACKED_BAR")], "restarts"),  # fmt: skip
        _chart("Trainer TPU duty cycle, per pod",
               [_series(duty_cycle, "ALIGN_MEAN", "REDUCE_MEAN", (resource_label("pod_name"),))], "%",
               threshold=("low-utilization alert", config.monitoring.low_utilization_percent)),  # fmt: skip
    ]


def _node_charts(config: StackConfig, group: str, selectors: Mapping[str, str]) -> list[dict]:
    def per_node(metric_type: str) -> dict:
        return _series(telemetry.time_series_filter(metric_type, K8S_NODE, config, selectors), "ALIGN_MEAN", "REDUCE_MEAN",
                       (resource_label("node_name"),))  # fmt: skip

    def pool_total(metric_type: str) -> dict:
        return _series(telemetry.time_series_filter(metric_type, K8S_NODE, config, selectors), "ALIGN_MEAN", "REDUCE_SUM", ())

    return [
        _chart(f"{group}: TensorCore utilization, per node", [per_node(telemetry.NODE_TENSORCORE_UTILIZATION)], "%"),
        _chart(f"{group}: TPU duty cycle, per node", [per_node(telemetry.NODE_DUTY_CYCLE)], "%"),
        _chart(f"{group}: HBM used and total", [pool_total(telemetry.NODE_HBM_USED), pool_total(telemetry.NODE_HBM_TOTAL)], "bytes"),
    ]


def _reported(config: StackConfig, metric: LogMetric, group_by: tuple[str, ...]) -> dict:
    # A distribution a period: the reducer's mean is the exact mean of the values the trainer reported.
    return _series(telemetry.log_metric_filter(metric, config), "ALIGN_DELTA", "REDUCE_MEAN", group_by)


def _series(filter_: str, aligner: str, reducer: str, group_by: Iterable[str], *, plot: str = "LINE") -> dict:
    aggregation = {"alignmentPeriod": ALIGNMENT, "perSeriesAligner": aligner, "crossSeriesReducer": reducer}
    if group_by:
        aggregation["groupByFields"] = list(group_by)
    return {"timeSeriesQuery": {"timeSeriesFilter": {"filter": filter_, "aggregation": aggregation}},
            "plotType": plot, "minAlignmentPeriod": ALIGNMENT}  # fmt: skip


def _chart(title: str, datasets: list[dict], unit: str, *, threshold: tuple[str, float] | None = None) -> dict:
    chart = {"dataSets": datasets, "yAxis": {"label": unit, "scale": "LINEAR"}}
    if threshold:
        label, value = threshold
        chart["thresholds"] = [{"label": label, "value": value, "color": "YELLOW", "direction": "BELOW", "targetAxis": "Y1"}]
    return {"title": title, "xyChart": chart}


def _tiles(widgets: list[dict]) -> list[dict]:
    per_row = COLUMNS // TILE_WIDTH
    return [
        {"xPos": index % per_row * TILE_WIDTH, "yPos": index // per_row * TILE_HEIGHT, "width": TILE_WIDTH,
         "height": TILE_HEIGHT, "widget": widget}
        for index, widget in enumerate(widgets)
    ]  # fmt: skip
