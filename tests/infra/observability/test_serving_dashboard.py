"""The serving row of the dashboard: vLLM's queue, latency and KV-cache metrics as Managed Prometheus
stores them, and the serving pool's TPU charts, checked as tests/infra/observability/test_monitoring.py checks the rest."""

from infra.config.serving import SERVING_POOL
from infra.catalog.names import NODE_POOL_LABEL
from tests.infra.observability import monitoring_filters as filters
from tests.infra.conftest import previewed
from tests.infra.observability.test_monitoring import ALIGNERS, GKE_METRICS, REDUCERS, _check_fields, charts, dashboard_of, queries

# Managed Prometheus: a Prometheus gauge is a GAUGE DOUBLE, a histogram a CUMULATIVE DISTRIBUTION, on
# prometheus_target (cloud.google.com/stackdriver/docs/managed-prometheus, metric kinds and resource).
VLLM_METRICS = {
    "prometheus.googleapis.com/vllm:num_requests_running/gauge": ("GAUGE", "DOUBLE"),
    "prometheus.googleapis.com/vllm:num_requests_waiting/gauge": ("GAUGE", "DOUBLE"),
    "prometheus.googleapis.com/vllm:kv_cache_usage_perc/gauge": ("GAUGE", "DOUBLE"),
    "prometheus.googleapis.com/vllm:time_to_first_token_seconds/histogram": ("CUMULATIVE", "DISTRIBUTION"),
    "prometheus.googleapis.com/vllm:e2e_request_latency_seconds/histogram": ("CUMULATIVE", "DISTRIBUTION"),
}
PROMETHEUS_TARGET_LABELS = {"project_id", "location", "cluster", "namespace", "job", "instance"}


def test_the_serving_row_charts_vllm_and_the_serving_pool():
    resources = previewed("serving").resources
    _check_fields(dashboard_of(resources), "Dashboard")
    series = [(filters.parse_time_series_filter(text), aggregation) for text, aggregation, _ in queries(resources)]
    vllm = [(parsed, aggregation) for parsed, aggregation in series if parsed.resource_type == "prometheus_target"]
    assert {parsed.metric_type for parsed, _ in vllm} == set(VLLM_METRICS)
    for parsed, aggregation in vllm:
        assert parsed.resource_labels == {"cluster": ("gemma-serving",), "namespace": ("training",)}
        kind, value_type = VLLM_METRICS[parsed.metric_type]
        kinds, value_types, aligned = ALIGNERS[aggregation["perSeriesAligner"]]
        assert kind in kinds and value_type in value_types
        assert (aligned or value_type) in REDUCERS[aggregation["crossSeriesReducer"]][0]
        for field in aggregation.get("groupByFields", []):
            assert filters.parse_selector(field)[1] in PROMETHEUS_TARGET_LABELS
    pool = {parsed.metric_type for parsed, _ in series if parsed.node_labels == {NODE_POOL_LABEL: (SERVING_POOL,)}}
    assert pool and pool <= set(GKE_METRICS)
    assert [c["title"] for c in charts(resources) if c["title"].startswith("Serving:")] == [
        "Serving: requests running and waiting", "Serving: time to first token, mean", "Serving: request latency, mean",
        "Serving: KV cache used, per replica",
    ]  # fmt: skip


def test_no_serving_row_without_serving():
    assert not [c for c in charts(previewed("dev").resources) if c["title"].startswith(("Serving:", SERVING_POOL))]
