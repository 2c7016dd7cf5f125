"""The platform of one stack as a function of its config: APIs, cluster, TPU pools, buckets,
identity, registry, the JobSet controller, the Kueue queue and monitoring, grouped as the `Platform` that what runs on it
(stack.py: the trainer image and the training run) builds on."""

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra.cloud.apis import ProjectApis
from infra.cloud.cluster import GkeCluster
from infra.cloud.identity import TrainingIdentity
from infra.cloud.multi_tier import MultiTierCheckpointing
from infra.cloud.network import StackNetwork
from infra.cloud.registry import Registry
from infra.cloud.storage import Buckets
from infra.cloud.tpu_pools import TpuPools
from infra.config import StackConfig
from infra.observability.monitoring import Monitoring
from infra.queueing.jobset import JobSetController
from infra.queueing.kueue import KueueQueue


@dataclass(frozen=True, kw_only=True)
class Platform:
    """Everything later parts of the stack (the trainer image, the training run) build on."""

    config: StackConfig
    gcp_provider: gcp.Provider
    apis: ProjectApis
    network: StackNetwork
    cluster: GkeCluster
    tpu_pools: TpuPools
    buckets: Buckets
    identity: TrainingIdentity
    registry: Registry
    jobset: JobSetController
    queue: KueueQueue | None  # None without gemma-tpu:queue.enabled
    monitoring: Monitoring | None  # None with gemma-tpu:monitoring.enabled false
    multi_tier: MultiTierCheckpointing | None = None  # None without gemma-tpu:cluster.multiTierCheckpointing

    @property
    def kubernetes_provider(self) -> k8s.Provider:
        return self.cluster.provider

    @property
    def namespace(self) -> k8s.core.v1.Namespace:
        return self.identity.namespace

    @property
    def service_account(self) -> k8s.core.v1.ServiceAccount:
        """The Kubernetes ServiceAccount training pods run as (Workload Identity bound)."""
        return self.identity.training.service_account

    @property
    def preparation_service_account(self) -> k8s.core.v1.ServiceAccount:
        """The Kubernetes ServiceAccount the data preparation pods run as (Workload Identity bound)."""
        return self.identity.preparation.service_account

    @property
    def registry_url(self) -> pulumi.Output[str]:
        return self.registry.url

    @property
    def jobset_install(self) -> pulumi.Resource:
        """Workloads that create JobSets depend on this."""
        return self.jobset.install

    @property
    def queue_objects(self) -> list[pulumi.Resource]:
        """Queued runs are created after these: their LocalQueue and what it admits with."""
        return [self.queue.objects] if self.queue else []

    @property
    def admission_webhooks(self) -> list[pulumi.Resource]:
        """Every Job and pod of the training namespace waits for these: Kueue's install, whose
        webhooks refuse them until it serves (workloads.deploy.RunPlatform)."""
        return [self.queue.install] if self.queue else []

    @property
    def identity_bindings(self) -> list[pulumi.Resource]:
        """What pods wait for: their Google accounts' bucket roles and Workload Identity bindings, and the
        CheckpointConfiguration whose driver serves their multi-tier volume."""
        return [*self.identity.training.bindings, *self.identity.preparation.bindings,
                *(self.multi_tier.configurations if self.multi_tier else ())]


def build(config: StackConfig) -> Platform:
    """Declare the infrastructure of one stack: APIs, cluster, TPU pools, buckets, identity,
    registry, the JobSet controller, the queue and monitoring."""
    gcp_provider = gcp.Provider(
        "gcp", gcp.ProviderArgs(project=config.project, region=config.region, zone=config.zone)
    )
    on_gcp = pulumi.ResourceOptions(providers=[gcp_provider])
    apis = ProjectApis("apis", config, opts=on_gcp)
    after_apis = apis.services
    network = StackNetwork("network", config, after=after_apis, opts=on_gcp)
    cluster = GkeCluster("cluster", config, network, after=after_apis, opts=on_gcp)
    buckets = Buckets("storage", config, after=after_apis, opts=on_gcp)
    identity = TrainingIdentity("identity", config, cluster, buckets, after=after_apis, opts=on_gcp)
    jobset = JobSetController("jobset", cluster)
    tpu_pools = TpuPools("tpu", config, cluster, after=after_apis, opts=on_gcp)
    # Kueue looks for the ProvisioningRequest API once, at start-up, and without it never runs its
    # provisioning admission check (kueue v0.19.2 cmd/kueue/main.go: "Skipping admission check
    # controller setup"): with queued provisioning it starts after the pools that use that API.
    kueue_after = [jobset.install, identity.namespace, *(tpu_pools.pools if config.queued_provisioning else ())]
    return Platform(
        config=config,
        gcp_provider=gcp_provider,
        apis=apis,
        network=network,
        cluster=cluster,
        tpu_pools=tpu_pools,
        buckets=buckets,
        identity=identity,
        registry=Registry("registry", config, cluster.node_service_account, after=after_apis, opts=on_gcp),
        jobset=jobset,
        queue=KueueQueue("queue", config, cluster, after=kueue_after) if config.queue.enabled else None,
        monitoring=Monitoring("monitoring", config, after=after_apis, opts=on_gcp) if config.monitoring.enabled else None,
        multi_tier=MultiTierCheckpointing("multi-tier", config, cluster, buckets, after=after_apis, opts=on_gcp)
        if config.multi_tier else None,
    )
