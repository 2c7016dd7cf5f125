"""The stack's dashboard, alert policies and log-based metrics, as `pulumi up` would send them
(offline, under Pulumi mocks): checked against the Monitoring API's shapes, the metrics that exist,
the stack's node pools and its gemma-tpu:monitoring config."""

import json
import re

import pytest

from infra.observability import telemetry
from trainer import contract
from infra.config import parse_stack_config
from infra.observability.monitoring import CONSOLE
from infra.catalog.names import NODE_POOL_LABEL, tpu_pool_names
from infra.preview import PLACEHOLDER_DASHBOARD_ID, preview
from tests.infra.observability import monitoring_filters as filters
from tests.infra.conftest import PROJECT_ID, SHIPPED_STACKS, of_type, one, previewed, stack_values

DASHBOARD = "gcp:monitoring/dashboard:Dashboard"
ALERT_POLICY = "gcp:monitoring/alertPolicy:AlertPolicy"
LOG_METRIC = "gcp:logging/metric:Metric"
MONITORING = (DASHBOARD, ALERT_POLICY, LOG_METRIC, "gemma-tpu:infra:Monitoring")

RESOURCE_LABELS = {  # the monitored resources' labels (cloud.google.com/monitoring/api/resources)
    "k8s_container": {"project_id", "location", "cluster_name", "namespace_name", "pod_name", "container_name"},
    "k8s_node": {"project_id", "location", "cluster_name", "node_name"},
    "k8s_cluster": {"project_id", "location", "cluster_name"},
}
ACCELERATOR_LABELS = {"make", "model", "accelerator_id"}
# GKE system metrics: type -> (kind, value type, monitored resource, metric labels), as
# cloud.google.com/monitoring/api/metrics_kubernetes lists them (the TPU ones: GKE's TPU monitoring guide).
GKE_METRICS = {
    "kubernetes.io/container/accelerator/duty_cycle": ("GAUGE", "INT64", "k8s_container", ACCELERATOR_LABELS),
    "kubernetes.io/container/restart_count": ("CUMULATIVE", "INT64", "k8s_container", set()),
    "kubernetes.io/container/uptime": ("GAUGE", "DOUBLE", "k8s_container", set()),
    "kubernetes.io/node/accelerator/duty_cycle": ("GAUGE", "INT64", "k8s_node", ACCELERATOR_LABELS),
    "kubernetes.io/node/accelerator/tensorcore_utilization": ("GAUGE", "DOUBLE", "k8s_node", ACCELERATOR_LABELS),
    "kubernetes.io/node/accelerator/memory_used": ("GAUGE", "INT64", "k8s_node", ACCELERATOR_LABELS),
    "kubernetes.io/node/accelerator/memory_total": ("GAUGE", "INT64", "k8s_node", ACCELERATOR_LABELS),
    "kubernetes.io/node/cpu/allocatable_cores": ("GAUGE", "DOUBLE", "k8s_node", set()),
}
NODE_LABELS = {NODE_POOL_LABEL, "cloud.google.com/gke-tpu-accelerator", "cloud.google.com/gke-tpu-topology"}
NUMERIC, ANY = {"INT64", "DOUBLE"}, {"INT64", "DOUBLE", "DISTRIBUTION", "BOOL"}
# What each aligner and reducer used accepts, and the value type it makes (None: the input's); the
# Aggregation reference of the Monitoring API v3.
ALIGNERS = {
    "ALIGN_MEAN": ({"GAUGE", "DELTA"}, NUMERIC, "DOUBLE"),
    "ALIGN_SUM": ({"GAUGE", "DELTA"}, NUMERIC | {"DISTRIBUTION"}, None),
    "ALIGN_DELTA": ({"CUMULATIVE", "DELTA"}, ANY, None),
}
REDUCERS = {"REDUCE_MEAN": (NUMERIC | {"DISTRIBUTION"}, "DOUBLE"), "REDUCE_SUM": (NUMERIC | {"DISTRIBUTION"}, None),
            "REDUCE_COUNT": (ANY, "INT64")}  # fmt: skip
ALERT_ALIGNMENT_MAX_S = 90_000  # 25 hours; charts may align over up to 104 weeks
# The Dashboards API v1 objects the dashboard uses: each object's fields, a field's type or enum.
DASHBOARD_FIELDS = {
    "Dashboard": {"displayName": str, "mosaicLayout": "MosaicLayout"},
    "MosaicLayout": {"columns": int, "tiles": ["Tile"]},
    "Tile": {"xPos": int, "yPos": int, "width": int, "height": int, "widget": "Widget"},
    "Widget": {"title": str, "xyChart": "XyChart"},
    "XyChart": {"dataSets": ["DataSet"], "yAxis": "Axis", "thresholds": ["Threshold"]},
    "DataSet": {"timeSeriesQuery": "TimeSeriesQuery", "plotType": {"LINE", "STACKED_AREA", "STACKED_BAR", "HEATMAP"},
                "minAlignmentPeriod": str, "legendTemplate": str},
    "TimeSeriesQuery": {"timeSeriesFilter": "TimeSeriesFilter"},
    "TimeSeriesFilter": {"filter": str, "aggregation": "Aggregation"},
    "Aggregation": {"alignmentPeriod": str, "perSeriesAligner": set(ALIGNERS), "crossSeriesReducer": set(REDUCERS),
                    "groupByFields": [str]},
    "Axis": {"label": str, "scale": {"LINEAR", "LOG10"}},
    "Threshold": {"label": str, "value": float, "color": {"YELLOW", "RED"}, "direction": {"ABOVE", "BELOW"},
                  "targetAxis": {"Y1", "Y2"}},
}  # fmt: skip


def dashboard_of(resources) -> dict:
    return json.loads(one(resources, DASHBOARD).inputs["dashboardJson"])


def charts(resources) -> list[dict]:
    return [tile["widget"] for tile in dashboard_of(resources)["mosaicLayout"]["tiles"]]


def queries(resources) -> list[tuple[str, dict, bool]]:
    """(filter, aggregation, in an alert) of every series the dashboard and the alerts read."""
    found = []
    for chart in charts(resources):
        for dataset in chart["xyChart"]["dataSets"]:
            series = dataset["timeSeriesQuery"]["timeSeriesFilter"]
            found.append((series["filter"], series["aggregation"], False))
    for policy in of_type(resources, ALERT_POLICY):
        for condition in policy.inputs["conditions"]:
            (body,) = [condition[key] for key in ("conditionThreshold", "conditionAbsent") if key in condition]
            (aggregation,) = body["aggregations"]
            found.append((body["filter"], aggregation, True))
    return found


def log_metrics(resources) -> dict[str, tuple]:
    """The stack's log-based metrics, as GKE_METRICS describes the others."""
    metrics = {}
    for metric in of_type(resources, LOG_METRIC):
        descriptor = metric.inputs["metricDescriptor"]
        (resource_type,) = [term.value for term in filters.parse_log_filter(metric.inputs["filter"]) if term.path == "resource.type"]
        metrics[telemetry.USER_METRIC_PREFIX + metric.inputs["name"]] = (
            descriptor["metricKind"], descriptor["valueType"], resource_type, set(metric.inputs.get("labelExtractors", {})),
        )
    return metrics


def policies(resources) -> dict[str, dict]:
    return {policy.name: policy.inputs for policy in of_type(resources, ALERT_POLICY)}


def threshold(policy: dict, index: int = 0) -> dict:
    return policy["conditions"][index]["conditionThreshold"]


def with_monitoring(stack: str, **keys):
    return preview(stack_values(stack, **{"gemma-tpu:monitoring": keys}), stack).resources


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_series_is_a_gke_metric_or_one_the_stack_creates_and_its_filter_parses(stack):
    resources = previewed(stack).resources
    known = {**GKE_METRICS, **log_metrics(resources)}
    for text, _, _ in queries(resources):
        parsed = filters.parse_time_series_filter(text)
        if parsed.resource_type == "prometheus_target":  # vLLM's, of gemma-tpu:serving: tests/infra/observability/test_serving_dashboard.py
            continue
        assert parsed.metric_type in known, text
        _, _, resource_type, metric_labels = known[parsed.metric_type]
        assert parsed.resource_type == resource_type, text
        assert parsed.resource_labels["cluster_name"] == (f"gemma-{stack}",)
        assert set(parsed.resource_labels) <= RESOURCE_LABELS[resource_type], text
        assert set(parsed.metric_labels) <= metric_labels, text
        assert not parsed.node_labels or (resource_type == "k8s_node" and set(parsed.node_labels) <= NODE_LABELS), text


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_aggregation_fits_its_metric(stack):
    resources = previewed(stack).resources
    known = {**GKE_METRICS, **log_metrics(resources)}
    for text, aggregation, in_alert in queries(resources):
        if filters.parse_time_series_filter(text).resource_type == "prometheus_target":  # tests/infra/observability/test_serving_dashboard.py
            continue
        kind, value_type, resource_type, metric_labels = known[filters.parse_time_series_filter(text).metric_type]
        kinds, value_types, aligned_type = ALIGNERS[aggregation["perSeriesAligner"]]
        assert kind in kinds and value_type in value_types, (text, aggregation)
        reducible, _ = REDUCERS[aggregation["crossSeriesReducer"]]
        assert (aligned_type or value_type) in reducible, (text, aggregation)
        seconds = int(aggregation["alignmentPeriod"].removesuffix("s"))
        assert 60 <= seconds <= (ALERT_ALIGNMENT_MAX_S if in_alert else 104 * 7 * 86400)
        for field in aggregation.get("groupByFields", []):
            selector, name = filters.parse_selector(field)
            assert name in (RESOURCE_LABELS[resource_type] if selector == "resource.label" else metric_labels), field


def _check_fields(value, kind, where="Dashboard"):
    if isinstance(kind, list):
        assert isinstance(value, list) and value, where
        for index, item in enumerate(value):
            _check_fields(item, kind[0], f"{where}[{index}]")
    elif isinstance(kind, set):
        assert value in kind, f"{where}: {value!r} is not one of {sorted(kind)}"
    elif isinstance(kind, str):
        assert isinstance(value, dict) and set(value) <= set(DASHBOARD_FIELDS[kind]), f"{where}: {sorted(value)}"
        for name, item in value.items():
            _check_fields(item, DASHBOARD_FIELDS[kind][name], f"{where}.{name}")
    else:
        assert isinstance(value, kind) or (kind is float and isinstance(value, int)), f"{where}: {value!r}"


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_the_dashboard_is_a_dashboards_api_document_whose_tiles_fit_and_do_not_overlap(stack):
    document = dashboard_of(previewed(stack).resources)
    _check_fields(document, "Dashboard")
    layout = document["mosaicLayout"]
    taken = set()
    for tile in layout["tiles"]:
        assert tile["xPos"] + tile["width"] <= layout["columns"]
        cells = {(tile["xPos"] + x, tile["yPos"] + y) for x in range(tile["width"]) for y in range(tile["height"])}
        assert not cells & taken, tile["widget"]["title"]
        taken |= cells


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_the_dashboard_charts_utilization_and_hbm_of_every_tpu_node_pool(stack):
    config = parse_stack_config(stack_values(stack), stack)
    if config.cluster_mode == "standard":
        groups = [{NODE_POOL_LABEL: (pool,)} for pool in tpu_pool_names(config.tpu.slices)]
    else:  # Autopilot has no pools of the stack's: the nodes it provisions for the slice shape
        groups = [{label: (value,) for label, value in config.slice.node_selector.items()}]
    charted = [filters.parse_time_series_filter(text) for text, _, in_alert in queries(previewed(stack).resources) if not in_alert]
    for group in groups:
        metrics = {series.metric_type for series in charted if series.node_labels == group}
        assert metrics == {telemetry.NODE_TENSORCORE_UTILIZATION, telemetry.NODE_DUTY_CYCLE, telemetry.NODE_HBM_USED,
                           telemetry.NODE_HBM_TOTAL}, group  # fmt: skip


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_the_dashboard_shows_the_run_from_the_trainers_lines_and_the_training_objects_events(stack):
    charted = {filters.parse_time_series_filter(text).metric_type for text, _, in_alert in queries(previewed(stack).resources)
               if not in_alert}  # fmt: skip
    user = f"{telemetry.USER_METRIC_PREFIX}gemma-tpu/{stack}/"
    assert {user + key for key in ("loss", "tokens_per_sec", "step_time_s", "run_events")} <= charted
    # Goodput and each badput category's share, as the trainer's report lines carry them.
    assert {user + key for key in (contract.GOODPUT_KEY, *contract.BADPUT_KEYS.values())} <= charted
    assert {telemetry.CONTAINER_RESTARTS, telemetry.CONTAINER_DUTY_CYCLE} <= charted


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_the_dashboard_url_is_a_stack_output(stack):
    assert previewed(stack).outputs["dashboardUrl"] == f"{CONSOLE}/{PLACEHOLDER_DASHBOARD_ID}?project={PROJECT_ID}"


def test_the_four_alerts_and_their_default_thresholds():
    alerts = policies(previewed("multihost").resources)
    assert set(alerts) == {"run-failed", "run-restarts", "low-tpu-utilization", "idle-tpu-nodes"}
    assert (threshold(alerts["run-failed"])["comparison"], threshold(alerts["run-failed"])["thresholdValue"]) == ("COMPARISON_GT", 0)
    assert threshold(alerts["run-restarts"])["thresholdValue"] == 3  # JobSet restart events, more than 3
    low = threshold(alerts["low-tpu-utilization"])
    assert (low["comparison"], low["thresholdValue"], low["duration"]) == ("COMPARISON_LT", 20, "1800s")
    idle_nodes, no_trainer = alerts["idle-tpu-nodes"]["conditions"]
    assert alerts["idle-tpu-nodes"]["combiner"] == "AND"
    assert idle_nodes["conditionThreshold"]["duration"] == no_trainer["conditionAbsent"]["duration"] == "1800s"


@pytest.mark.parametrize(("stack", "first_try"), [("dev", 1), ("multislice", 0)])
def test_each_alert_threshold_is_its_config_key(stack, first_try):
    """A Job's first try is a pod created too; a JobSet records restarts only."""
    alerts = policies(with_monitoring(stack, restartAlertCount=7, lowUtilizationPercent=35.5, lowUtilizationMinutes=45,
                                      idleNodesMinutes=90))  # fmt: skip
    assert threshold(alerts["run-restarts"])["thresholdValue"] == 7 + first_try
    low = threshold(alerts["low-tpu-utilization"])
    assert (low["thresholdValue"], low["duration"]) == (35.5, "2700s")
    idle_nodes, no_trainer = alerts["idle-tpu-nodes"]["conditions"]
    assert idle_nodes["conditionThreshold"]["duration"] == no_trainer["conditionAbsent"]["duration"] == "5400s"
    duty_cycle_chart = next(c for c in charts(with_monitoring(stack, lowUtilizationPercent=35.5)) if "thresholds" in c["xyChart"])
    assert duty_cycle_chart["xyChart"]["thresholds"][0]["value"] == 35.5


def test_alerts_notify_the_configured_channels_and_none_by_default():
    assert all(not alert.get("notificationChannels") for alert in policies(previewed("dev").resources).values())
    channels = [f"projects/{PROJECT_ID}/notificationChannels/123", f"projects/{PROJECT_ID}/notificationChannels/456"]
    assert all(alert["notificationChannels"] == channels for alert in policies(with_monitoring("dev", notificationChannels=channels)).values())


def test_monitoring_can_be_turned_off():
    result = preview(stack_values("dev", **{"gemma-tpu:monitoring": {"enabled": False}}), "dev")
    assert not [r for r in result.resources if r.type in MONITORING]
    assert "dashboardUrl" not in result.outputs


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_log_metrics_are_well_formed_and_alerts_wait_for_them(stack):
    resources = previewed(stack).resources
    metrics = of_type(resources, LOG_METRIC)
    for metric in metrics:
        inputs = metric.inputs
        filters.parse_log_filter(inputs["filter"])
        descriptor = inputs["metricDescriptor"]
        assert {label["key"] for label in descriptor["labels"]} == set(inputs["labelExtractors"])
        for extractor in [*inputs["labelExtractors"].values(), *filter(None, [inputs.get("valueExtractor")])]:
            filters.extract(extractor, {})  # well-formed: REGEXP_EXTRACT with one capture group
        distribution = "valueExtractor" in inputs
        assert descriptor["valueType"] == ("DISTRIBUTION" if distribution else "INT64") and descriptor["metricKind"] == "DELTA"
        assert ("bucketOptions" in inputs) == distribution
    for policy in of_type(resources, ALERT_POLICY):
        assert {m.name for m in metrics} <= set(policy.depends_on)


def _event(kind: str, name: str, reason: str, namespace: str = "training") -> dict:
    """A Kubernetes event as GKE's event exporter logs it (the Event object as jsonPayload)."""
    return {
        "logName": f"projects/{PROJECT_ID}/logs/events",
        "resource": {"type": "k8s_cluster", "labels": {"cluster_name": "gemma-multislice", "project_id": PROJECT_ID}},
        "jsonPayload": {"involvedObject": {"kind": kind, "name": name, "namespace": namespace}, "reason": reason, "type": "Warning"},
    }


def test_the_run_events_metric_counts_the_training_jobsets_events_by_reason():
    run = telemetry.run_telemetry(parse_stack_config(stack_values("multislice"), "multislice"))
    metric, events = run.run_events, run.events
    failed = _event("JobSet", "gemma-finetune-0123abcd", "FailJobSetFailurePolicyAction")
    assert filters.matches(metric.filter, failed)
    assert filters.extract(metric.labels["reason"], failed) in events.failed
    assert filters.extract(metric.labels["run"], failed) == "gemma-finetune-0123abcd"
    restarted = _event("JobSet", "gemma-finetune-0123abcd", "RestartJobSetAndIgnoreMaxRestartsFailurePolicyAction")
    assert filters.extract(metric.labels["reason"], restarted) in events.restarted
    # A slice's own Job fails on every restart: the JobSet's events say what became of the run.
    assert not filters.matches(metric.filter, _event("Job", "gemma-finetune-0123abcd-slice-0", "PodFailurePolicy"))
    assert not filters.matches(metric.filter, _event("JobSet", "gemma-finetune-0123abcd", "FailedJobs", namespace="other"))
    assert not filters.matches(metric.filter, _event("JobSet", "other-run-0123abcd", "FailedJobs"))


# Limits of the Monitoring and Logging APIs that the schema-free pulumi inputs do not show
# (cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.alertPolicies: MetricAbsence.duration
# "minimum 120 seconds", larger values whole minutes; cloud.google.com/monitoring/quotas: 6
# conditions a policy, user labels of at most 63 lowercase letters, digits, '_' and '-';
# cloud.google.com/logging/quotas and LogMetric.name: at most 10 labels a metric, names of at
# most 100 of A-Z a-z 0-9 _-.,+!*',()%/ , label keys starting with a letter).
_ABSENCE_MIN_S = 120
_CONDITIONS_MAX = 6
_USER_LABEL = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_USER_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_LOG_METRIC_NAME = re.compile(r"^[A-Za-z0-9_\-.,+!*',()%/]{1,100}$")
_LOG_LABEL_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,99}$")
_LOG_LABELS_MAX = 10


def _seconds(duration: str) -> int:
    assert re.fullmatch(r"\d+s", duration), duration
    return int(duration[:-1])


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_alert_policies_and_log_metrics_keep_within_the_apis_limits(stack):
    resources = previewed(stack).resources
    for name, policy in policies(resources).items():
        assert len(policy["conditions"]) <= _CONDITIONS_MAX, name
        assert all(_USER_LABEL.match(k) and _USER_LABEL_VALUE.match(v) for k, v in policy["userLabels"].items()), name
        for condition in policy["conditions"]:
            if "conditionAbsent" in condition:
                seconds = _seconds(condition["conditionAbsent"]["duration"])
                assert seconds >= _ABSENCE_MIN_S and seconds % 60 == 0, name
            else:
                assert _seconds(condition["conditionThreshold"]["duration"]) % 60 == 0, name
    for metric in of_type(resources, LOG_METRIC):
        labels = metric.inputs["metricDescriptor"].get("labels", [])
        assert _LOG_METRIC_NAME.match(metric.inputs["name"]) and len(labels) <= _LOG_LABELS_MAX, metric.name
        assert all(_LOG_LABEL_KEY.match(label["key"]) for label in labels), metric.name


def test_the_shortest_idle_window_the_config_allows_is_an_absence_the_api_takes():
    """gemma-tpu:monitoring.idleNodesMinutes' floor (5) is above MetricAbsence's 120 s."""
    (policy,) = [p for p in of_type(with_monitoring("dev", idleNodesMinutes=5), ALERT_POLICY) if p.name == "idle-tpu-nodes"]
    assert _seconds(policy.inputs["conditions"][1]["conditionAbsent"]["duration"]) == 300 >= _ABSENCE_MIN_S
