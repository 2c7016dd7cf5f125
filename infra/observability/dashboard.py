"""The stack's Cloud Monitoring dashboard as a function of its config: the run (loss, tokens/s, step
time, goodput and its badput breakdown, the training object's events, container restarts, the trainer's
TPU duty cycle), then each TPU
node pool (TensorCore utilization, duty cycle, HBM). The JSON is the Dashboards API's `Dashboard`
(cloud.google.com/monitoring/api/ref_v3/rest/v1/projects.dashboards)."""

from collections.abc import Iterable

from infra.config import StackConfig
from infra.observability.telemetry import LogMetric, NodeSeries, RunTelemetry, metric_label, resource_label

COLUMNS = 12
TILE_WIDTH, TILE_HEIGHT = 4, 4  # three charts a row
ALIGNMENT = "60s"  # GKE samples its metrics every 60 s


def dashboard(config: StackConfig, run: RunTelemetry, more_charts: Iterable[dict] = ()) -> dict:
    """The run's charts, each TPU node group's, then `more_charts`: the rows other parts of the
    stack add from this module's chart builders (infra.observability.serving_dashboard), which
    infra.observability.monitoring joins, so that this module imports none of them. Every series is
    `run`'s (infra.observability.telemetry.run_telemetry): this module only draws."""
    charts = _run_charts(config, run)
    for nodes in run.tpu_nodes:
        charts += node_charts(nodes)
    charts += more_charts
    return {"displayName": f"gemma-tpu {config.stack}", "mosaicLayout": {"columns": COLUMNS, "tiles": _tiles(charts)}}


def _run_charts(config: StackConfig, run: RunTelemetry) -> list[dict]:
    by_run = (metric_label("run"),)
    return [
        chart("Loss", [_reported(run.loss, by_run)], "loss"),
        chart("Tokens per second", [_reported(run.tokens_per_sec, by_run)], "tokens/s"),
        chart("Seconds per step", [_reported(run.step_time, by_run)], "s"),
        chart("Goodput: share of the run's wall time in kept steps", [_reported(run.goodput, by_run)], "share"),
        # One area a category, over every run: the breakdown of the same wall time as the goodput.
        chart("Badput by category (ml-goodput-measurement's names)",
              [_reported(metric, (), plot="STACKED_AREA", legend=category) for category, metric in run.badput.items()], "share"),
        chart(f"Run events of the {run.events.kind}, by reason",
              [series(run.run_events.series, "ALIGN_SUM", "REDUCE_SUM", (metric_label("reason"),), plot="STACKED_BAR")], "events"),
        chart("Container restarts in the training namespace",
              [series(run.container_restarts, "ALIGN_DELTA", "REDUCE_SUM", (resource_label("pod_name"), resource_label("container_name")),
                      plot="STACKED_BAR")], "restarts"),
        chart("Trainer TPU duty cycle, per pod",
              [series(run.trainer_duty_cycle, "ALIGN_MEAN", "REDUCE_MEAN", (resource_label("pod_name"),))], "%",
              threshold=("low-utilization alert", config.monitoring.low_utilization_percent)),
    ]  # fmt: skip


def node_charts(nodes: NodeSeries) -> list[dict]:
    """TensorCore utilization and duty cycle per node, HBM used and total over the group."""

    def per_node(filter_: str) -> dict:
        return series(filter_, "ALIGN_MEAN", "REDUCE_MEAN", (resource_label("node_name"),))

    def total(filter_: str) -> dict:
        return series(filter_, "ALIGN_MEAN", "REDUCE_SUM", ())

    return [
        chart(f"{nodes.title}: TensorCore utilization, per node", [per_node(nodes.tensorcore_utilization)], "%"),
        chart(f"{nodes.title}: TPU duty cycle, per node", [per_node(nodes.duty_cycle)], "%"),
        chart(f"{nodes.title}: HBM used and total", [total(nodes.hbm_used), total(nodes.hbm_total)], "bytes"),
    ]


def _reported(metric: LogMetric, group_by: tuple[str, ...], *, plot: str = "LINE", legend: str | None = None) -> dict:
    # A distribution a period: the reducer's mean is the exact mean of the values the trainer reported.
    return series(metric.series, "ALIGN_DELTA", "REDUCE_MEAN", group_by, plot=plot, legend=legend)


def series(filter_: str, aligner: str, reducer: str, group_by: Iterable[str], *, plot: str = "LINE", legend: str | None = None) -> dict:
    aggregation = {"alignmentPeriod": ALIGNMENT, "perSeriesAligner": aligner, "crossSeriesReducer": reducer}
    if group_by:
        aggregation["groupByFields"] = list(group_by)
    dataset = {"timeSeriesQuery": {"timeSeriesFilter": {"filter": filter_, "aggregation": aggregation}},
               "plotType": plot, "minAlignmentPeriod": ALIGNMENT}  # fmt: skip
    if legend is not None:
        dataset["legendTemplate"] = legend
    return dataset


def chart(title: str, datasets: list[dict], unit: str, *, threshold: tuple[str, float] | None = None) -> dict:
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
