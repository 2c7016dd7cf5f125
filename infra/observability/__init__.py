"""What the stack watches: the metrics and their filters (telemetry), the dashboard and its serving
row, the alert policies, the components declaring them and the metrics adapter. Imports
infra.cloud, infra.config, infra.catalog, infra.errors (and trainer.contract); not infra.queueing.
"""
