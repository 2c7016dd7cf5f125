"""The whole Pulumi program as a function of the stack config, so that `__main__.py` (a real
`pulumi up`), `python -m infra.preview` and the tests (under Pulumi mocks) run the same code."""

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra.apis import ProjectApis
from infra.cluster import GkeCluster
from infra.config import StackConfig
from infra.identity import TrainingIdentity
from infra.image import TrainerImage
from infra.jobset import JOBSET_VERSION, JobSetController
from infra.pricing import tpu_cost_per_hour
from infra.registry import Registry
from infra.storage import Buckets
from infra.tpu_pools import TpuPools
from workloads.deploy import TrainingRun


@dataclass(frozen=True, kw_only=True)
class Platform:
    """Everything later parts of the stack (the trainer image, the training run) build on."""

    config: StackConfig
    gcp_provider: gcp.Provider
    apis: ProjectApis
    cluster: GkeCluster
    tpu_pools: TpuPools
    buckets: Buckets
    identity: TrainingIdentity
    registry: Registry
    jobset: JobSetController

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
    def identity_bindings(self) -> list[pulumi.Resource]:
        """What pods wait for: their Google accounts' bucket roles and Workload Identity bindings."""
        return [*self.identity.training.bindings, *self.identity.preparation.bindings]


def build(config: StackConfig) -> Platform:
    """Declare the infrastructure of one stack: APIs, cluster, TPU pools, buckets, identity,
    registry and the JobSet controller."""
    gcp_provider = gcp.Provider(
        "gcp", gcp.ProviderArgs(project=config.project, region=config.region, zone=config.zone)
    )
    on_gcp = pulumi.ResourceOptions(providers=[gcp_provider])
    apis = ProjectApis("apis", config, opts=on_gcp)
    after_apis = apis.services
    cluster = GkeCluster("cluster", config, after=after_apis, opts=on_gcp)
    buckets = Buckets("storage", config, after=after_apis, opts=on_gcp)
    return Platform(
        config=config,
        gcp_provider=gcp_provider,
        apis=apis,
        cluster=cluster,
        tpu_pools=TpuPools("tpu", config, cluster, after=after_apis, opts=on_gcp),
        buckets=buckets,
        identity=TrainingIdentity("identity", config, cluster, buckets, after=after_apis, opts=on_gcp),
        registry=Registry("registry", config, cluster.node_service_account, after=after_apis, opts=on_gcp),
        jobset=JobSetController("jobset", cluster),
    )


def deploy_run(platform: Platform) -> TrainingRun:
    """The trainer image (built into the stack's registry unless `gemma-tpu:image` names one) and
    the training run on it: data preparation, then training once the TPU pools exist."""
    config = platform.config
    image = TrainerImage("trainer-image", config=config, repository_url=platform.registry_url)
    return TrainingRun(
        "training",
        config=config,
        image=image.ref,
        provider=platform.kubernetes_provider,
        namespace=platform.namespace,
        service_account=platform.service_account,
        preparation_service_account=platform.preparation_service_account,
        jobset_install=platform.jobset_install,
        after=platform.identity_bindings,
        training_after=platform.tpu_pools.pools,
    )


def export_outputs(platform: Platform, run: TrainingRun) -> None:
    """The stack outputs a user reads with `pulumi stack output`."""
    config = platform.config
    cluster = platform.cluster.cluster
    pulumi.export("clusterName", cluster.name)
    pulumi.export("clusterLocation", cluster.location)
    pulumi.export(
        "getCredentials",
        pulumi.Output.concat(
            "gcloud container clusters get-credentials ", cluster.name,
            " --location ", cluster.location, " --project ", config.project,
        ),
    )
    pulumi.export("dataBucketUrl", platform.buckets.data.url)
    pulumi.export("artifactsBucketUrl", platform.buckets.artifacts.url)
    pulumi.export("registryUrl", platform.registry_url)
    pulumi.export("namespace", platform.namespace.metadata.name)
    pulumi.export("kubernetesServiceAccount", platform.service_account.metadata.name)
    pulumi.export("trainingServiceAccount", platform.identity.training.google_service_account.email)
    pulumi.export("preparationServiceAccount", platform.identity.preparation.google_service_account.email)
    pulumi.export("jobsetVersion", JOBSET_VERSION)
    pulumi.export(
        "tpu",
        {
            "accelerator": config.slice.accelerator,
            "topology": config.slice.topology,
            "machineType": config.slice.machine_type,
            "slices": config.tpu.slices,
            "hostsPerSlice": config.slice.hosts,
            "chipsPerHost": config.slice.chips_per_host,
            "capacity": config.tpu.capacity,
            "nodeSelector": config.slice.node_selector,
        },
    )
    pulumi.export("tpuCostPerHourUsd", tpu_cost_per_hour(config))
    pulumi.export("trainingRun", run.run_name)
    pulumi.export("trainingStatus", run.status_command)
    pulumi.export("trainingLogs", run.logs_command)
    pulumi.export("tensorboardDir", run.tensorboard_dir)


def run(config: StackConfig) -> None:
    """The program: the infrastructure, then what runs on it, then the outputs."""
    platform = build(config)
    export_outputs(platform, deploy_run(platform))
