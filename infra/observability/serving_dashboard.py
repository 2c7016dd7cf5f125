"""The serving row of the stack's dashboard (gemma-tpu:serving): vLLM's own metrics, as Managed Service
for Prometheus stores them from the serving PodMonitoring, then the serving pool's TPU charts.

vLLM's names (vllm/v1/metrics/loggers.py): the gauges vllm:num_requests_running,
vllm:num_requests_waiting and vllm:kv_cache_usage_perc (0 to 1), the histograms
vllm:time_to_first_token_seconds and vllm:e2e_request_latency_seconds. Managed Prometheus writes each
as prometheus.googleapis.com/NAME/KIND on the prometheus_target resource, whose cluster and namespace
labels are `cluster` and `namespace`.
"""

from infra.catalog.names import NODE_POOL_LABEL
from infra.config import StackConfig
from infra.config.serving import SERVING_POOL
from infra.observability.dashboard import chart, node_charts, series
from infra.observability.telemetry import node_label, node_series, resource_label

PROMETHEUS_TARGET = "prometheus_target"


def _vllm(config: StackConfig, name: str, kind: str) -> str:
    terms = {"metric.type": f"prometheus.googleapis.com/{name}/{kind}", "resource.type": PROMETHEUS_TARGET,
             resource_label("cluster"): config.cluster_name, resource_label("namespace"): config.namespace}  # fmt: skip
    return " AND ".join(f'{selector} = "{value}"' for selector, value in terms.items())


def serving_charts(config: StackConfig) -> list[dict]:
    """Nothing without gemma-tpu:serving."""
    if config.serving is None:
        return []

    def total(name: str) -> dict:
        return series(_vllm(config, name, "gauge"), "ALIGN_MEAN", "REDUCE_SUM", ())

    def mean(name: str) -> dict:  # of every request's value in the period, over all replicas
        return series(_vllm(config, name, "histogram"), "ALIGN_DELTA", "REDUCE_MEAN", ())

    per_replica = series(_vllm(config, "vllm:kv_cache_usage_perc", "gauge"), "ALIGN_MEAN", "REDUCE_MEAN",
                          (resource_label("instance"),))  # fmt: skip
    charts = [
        chart("Serving: requests running and waiting", [total("vllm:num_requests_running"), total("vllm:num_requests_waiting")],
               "requests"),  # fmt: skip
        chart("Serving: time to first token, mean", [mean("vllm:time_to_first_token_seconds")], "s"),
        chart("Serving: request latency, mean", [mean("vllm:e2e_request_latency_seconds")], "s"),
        chart("Serving: KV cache used, per replica", [per_replica], "fraction"),
    ]
    if config.cluster_mode == "standard":
        charts += node_charts(node_series(config, SERVING_POOL, {node_label(NODE_POOL_LABEL): SERVING_POOL}))
    return charts
