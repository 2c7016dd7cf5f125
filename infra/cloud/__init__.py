"""The cloud platform a run builds on, as Pulumi components: project APIs, network, GKE cluster, TPU
node pools, buckets, registry, the trainer image, accounts and Workload Identity. Imports
infra.config, infra.catalog, infra.errors (and trainer.contract); nothing of queueing or observability.
"""
