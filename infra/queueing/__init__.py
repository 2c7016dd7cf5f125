"""What runs wait in: the Kueue objects (queues, pure), Kueue and the JobSet controller installed on the
cluster. Imports infra.cloud, infra.config, infra.catalog, infra.errors; not infra.observability.
"""
