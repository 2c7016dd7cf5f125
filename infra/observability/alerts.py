"""The stack's alert policies as a function of its config: a run that failed, a run that restarted
more than `restartAlertCount` times in a day, a running trainer whose TPUs stay below
`lowUtilizationPercent` busy for `lowUtilizationMinutes` (stuck or input-bound), and TPU nodes up for
`idleNodesMinutes` with no trainer running (money burning). Keys of gemma-tpu:monitoring."""

from collections.abc import Sequence

import pulumi_gcp as gcp

from infra.config import StackConfig
from infra.observability import telemetry
from infra.observability.telemetry import K8S_CONTAINER, K8S_NODE, OneOf, RunTelemetry, metric_label, resource_label

EVENT_WINDOW = "300s"  # how long an event (a failure) keeps its condition met
RESTART_WINDOW_S = 24 * 3600  # restarts are counted over a day (an alert's window is at most 25 hours)
_SEVERITY = {"run-failed": "ERROR"}  # the others warn


def alert_policies(config: StackConfig, run: RunTelemetry) -> dict[str, gcp.monitoring.AlertPolicyArgs]:
    """Policy name -> its arguments."""
    monitoring, by_run, minutes = config.monitoring, [metric_label("run")], config.monitoring.idle_nodes_minutes
    trainers = telemetry.trainer_containers(config)
    conditions = {
        "run-failed": [_threshold(
            f"the training {run.events.kind} failed", _run_events(config, run, run.events.failed),
            aligner="ALIGN_SUM", period=EVENT_WINDOW, reducer="REDUCE_SUM", group_by=by_run, above=0,
        )],
        "run-restarts": [_threshold(
            f"a run restarted more than {monitoring.restart_alert_count} times in a day",
            _run_events(config, run, run.events.restarted),
            aligner="ALIGN_SUM", period=f"{RESTART_WINDOW_S}s", reducer="REDUCE_SUM", group_by=by_run,
            above=monitoring.restart_alert_count + run.events.first_try_counted,
        )],
        "low-tpu-utilization": [_threshold(
            f"a trainer's TPU duty cycle below {monitoring.low_utilization_percent:g}% for {monitoring.low_utilization_minutes} min",
            telemetry.time_series_filter(telemetry.CONTAINER_DUTY_CYCLE, K8S_CONTAINER, config, trainers),
            aligner="ALIGN_MEAN", period="60s", reducer="REDUCE_MEAN", group_by=[resource_label("pod_name")],
            below=monitoring.low_utilization_percent, minutes=monitoring.low_utilization_minutes,
        )],
        "idle-tpu-nodes": [
            _threshold(
                f"TPU nodes up for {minutes} min",
                telemetry.time_series_filter(telemetry.NODE_ALLOCATABLE_CORES, K8S_NODE, config, telemetry.tpu_nodes(config)),
                aligner="ALIGN_MEAN", period="60s", reducer="REDUCE_COUNT", group_by=(), above=0, minutes=minutes,
            ),
            _absent(f"no trainer running for {minutes} min",
                    telemetry.time_series_filter(telemetry.CONTAINER_UPTIME, K8S_CONTAINER, config, trainers), minutes=minutes),
        ],
    }  # fmt: skip
    return {
        name: gcp.monitoring.AlertPolicyArgs(
            display_name=f"gemma-tpu {config.stack}: {name.replace('-', ' ')}",
            combiner="AND",  # every condition at once (all but idle-tpu-nodes have one)
            conditions=policy_conditions,
            documentation=gcp.monitoring.AlertPolicyDocumentationArgs(content=_what_to_do(config, name), mime_type="text/markdown"),
            notification_channels=list(monitoring.notification_channels) or None,
            severity=_SEVERITY.get(name, "WARNING"),
            user_labels={"stack": config.stack},
        )
        for name, policy_conditions in conditions.items()
    }


def _run_events(config: StackConfig, run: RunTelemetry, reasons: tuple[str, ...]) -> str:
    """The training object's events of these reasons."""
    return telemetry.time_series_filter(run.run_events.metric_type, run.run_events.resource_type, config,
                                        {metric_label("reason"): OneOf(reasons)})  # fmt: skip


def _threshold(title: str, filter_: str, *, aligner: str, period: str, reducer: str, group_by: Sequence[str],
               above: float | None = None, below: float | None = None, minutes: int = 0) -> gcp.monitoring.AlertPolicyConditionArgs:
    """Met while the aggregated series is above (or below) the value for `minutes`; no data (no run,
    no event in the window) is not met."""
    aggregation = gcp.monitoring.AlertPolicyConditionConditionThresholdAggregationArgs(
        alignment_period=period, per_series_aligner=aligner, cross_series_reducer=reducer, group_by_fields=list(group_by) or None,
    )
    return gcp.monitoring.AlertPolicyConditionArgs(
        display_name=title,
        condition_threshold=gcp.monitoring.AlertPolicyConditionConditionThresholdArgs(
            filter=filter_,
            aggregations=[aggregation],
            comparison="COMPARISON_LT" if below is not None else "COMPARISON_GT",
            threshold_value=below if below is not None else above,
            duration=f"{minutes * 60}s",
            evaluation_missing_data="EVALUATION_MISSING_DATA_INACTIVE",
        ),
    )  # fmt: skip


def _absent(title: str, filter_: str, *, minutes: int) -> gcp.monitoring.AlertPolicyConditionArgs:
    """Met when no series matches for `minutes`."""
    return gcp.monitoring.AlertPolicyConditionArgs(
        display_name=title,
        condition_absent=gcp.monitoring.AlertPolicyConditionConditionAbsentArgs(
            filter=filter_,
            aggregations=[gcp.monitoring.AlertPolicyConditionConditionAbsentAggregationArgs(
                alignment_period="60s", per_series_aligner="ALIGN_MEAN", cross_series_reducer="REDUCE_COUNT",
            )],
            duration=f"{minutes * 60}s",
        ),
    )  # fmt: skip


def _what_to_do(config: StackConfig, name: str) -> str:
    status = f"`pulumi stack output trainingStatus` (kubectl in namespace {config.namespace})"
    return {
        "run-failed": f"The run stopped and will not restart. {status} shows the failure; the trainer's last lines "
                      "(`pulumi stack output trainingLogs`) say why. Fix the cause and `pulumi up` a new run.",
        "run-restarts": f"The run keeps restarting (preemptions, or the trainer asking to be retried). {status}; "
                        "Spot capacity is reclaimed often; a reservation or on-demand capacity restarts less.",
        "low-tpu-utilization": "The trainer runs but its TPUs are mostly idle: stuck (a hung collective, a slow "
                               "checkpoint) or input-bound (data reads). Compare tokens/s and step time on the dashboard.",
        "idle-tpu-nodes": "TPU nodes are up and billing, but no trainer runs on them: a run waiting for data "
                          f"preparation, a finished run whose nodes are not yet removed, or pods that cannot start. {status}.",
    }[name]
