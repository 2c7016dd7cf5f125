"""The stack's Cloud Monitoring: its log-based metrics, dashboard and alert policies (built by
infra.observability.telemetry, infra.observability.dashboard with infra.observability.serving_dashboard's row, and infra.observability.alerts from the
stack config)."""

import json
from collections.abc import Sequence

import pulumi
import pulumi_gcp as gcp

from infra.cloud.component import Component
from infra.config import StackConfig
from infra.observability import alerts, dashboard, telemetry
from infra.observability.serving_dashboard import serving_charts

CONSOLE = "https://console.cloud.google.com/monitoring/dashboards/builder"
# Distributions of reported numbers: exact means (what the dashboard shows), percentiles to within a
# bucket (20%), from 1e-3 (seconds per step, a loss near 0) to 1.3e8 (tokens per second of a large slice).
_BUCKETS = gcp.logging.MetricBucketOptionsArgs(
    exponential_buckets=gcp.logging.MetricBucketOptionsExponentialBucketsArgs(num_finite_buckets=140, growth_factor=1.2, scale=1e-3)
)


class Monitoring(Component):
    """`log_metrics`, `dashboard`, `alert_policies` (by name) and `dashboard_url`."""

    def __init__(self, name: str, config: StackConfig, *, after: Sequence[pulumi.Resource] = (), opts=None):
        super().__init__("Monitoring", name, after=after, opts=opts)
        run = telemetry.run_telemetry(config)
        self.log_metrics = [self._log_metric(metric) for metric in run.log_metrics]
        self.dashboard = gcp.monitoring.Dashboard(
            "dashboard",
            gcp.monitoring.DashboardArgs(dashboard_json=json.dumps(dashboard.dashboard(config, run, serving_charts(config)), sort_keys=True)),
            opts=self.child(),
        )
        # The API refuses a policy on a log-based metric that does not exist yet.
        self.alert_policies = {
            policy: gcp.monitoring.AlertPolicy(policy, args, opts=self.child(*self.log_metrics))
            for policy, args in alerts.alert_policies(config, run).items()
        }
        # The resource's ID is projects/PROJECT/dashboards/ID; the console opens a dashboard by its ID.
        self.dashboard_url = self.dashboard.id.apply(lambda id_: f"{CONSOLE}/{id_.rsplit('/', 1)[-1]}?project={config.project}")
        self.register_outputs({"dashboardUrl": self.dashboard_url})

    def _log_metric(self, metric: telemetry.LogMetric) -> gcp.logging.Metric:
        distribution = metric.value_extractor is not None
        return gcp.logging.Metric(
            f"log-metric-{metric.key.replace('_', '-')}",
            gcp.logging.MetricArgs(
                name=metric.name,
                description=metric.description,
                filter=metric.filter,
                metric_descriptor=gcp.logging.MetricMetricDescriptorArgs(
                    metric_kind="DELTA",
                    value_type="DISTRIBUTION" if distribution else "INT64",
                    unit=metric.unit,
                    labels=[gcp.logging.MetricMetricDescriptorLabelArgs(key=label, value_type="STRING") for label in metric.labels],
                ),
                label_extractors=dict(metric.labels),
                value_extractor=metric.value_extractor,
                bucket_options=_BUCKETS if distribution else None,
            ),
            opts=self.child(),
        )
