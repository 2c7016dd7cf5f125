"""The Pulumi program as a function of the stack config, joining the platform (infra) and the run
on it (workloads): `__main__.py` (a real `pulumi up`), `python -m infra.preview` and the tests (under
Pulumi mocks) declare the same stack. Nothing below this module imports it.
"""

import pulumi

from infra.cloud.image import TrainerImage
from infra.config import StackConfig
from infra.platform import Platform, build
from infra.pricing import tpu_cost_per_hour
from infra.queueing.jobset import JOBSET_VERSION
from infra.queueing.kueue import KUEUE_VERSION
from infra.serving import ServingInfra
from workloads.deploy import RunPlatform, ServingDeployment, TrainingRun, training_runs


def deploy_runs(platform: Platform) -> list[TrainingRun]:
    """The trainer image (built into the stack's registry unless `gemma-tpu:image` names one) and
    the training runs on it: data preparation, then training once the TPU pools (and the queue) exist."""
    config = platform.config
    image = TrainerImage("trainer-image", config=config, repository_url=platform.registry_url)
    run_platform = RunPlatform(
        provider=platform.kubernetes_provider,
        namespace=platform.namespace,
        service_account=platform.service_account,
        preparation_service_account=platform.preparation_service_account,
        jobset_install=platform.jobset_install,
        webhooks=platform.admission_webhooks,
        after=platform.identity_bindings,
        training_after=[*platform.tpu_pools.pools, *platform.queue_objects],
    )
    return training_runs(config, image=image.ref, platform=run_platform)


def export_run_outputs(config: StackConfig, runs: list[TrainingRun]) -> None:
    """One run: its name and commands as top-level outputs. A run list: `runs`, each run's by name,
    and the queue's status line."""
    if not config.run_list:
        (run,) = runs
        pulumi.export("trainingRun", run.run_name)
        pulumi.export("trainingStatus", run.status_command)
        pulumi.export("trainingLogs", run.logs_command)
        pulumi.export("tensorboardDir", run.tensorboard_dir)
    else:
        pulumi.export("runs", {
            run_config.name: {"runName": run.run_name, "status": run.status_command, "logs": run.logs_command,
                              "tensorboardDir": run.tensorboard_dir}
            for run_config, run in zip(config.runs, runs)
        })  # fmt: skip
    if config.queue.enabled:
        pulumi.export("kueueVersion", KUEUE_VERSION)
        pulumi.export("queueStatus", f"kubectl get workloads -n {config.namespace}")


def export_outputs(platform: Platform, runs: list[TrainingRun]) -> None:
    """The stack outputs a user reads with `pulumi stack output`."""
    config = platform.config
    cluster = platform.cluster.cluster
    pulumi.export("clusterName", cluster.name)
    pulumi.export("clusterLocation", cluster.location)
    pulumi.export(
        "getCredentials",
        pulumi.Output.concat(
            "gcloud container clusters get-credentials ", cluster.name,
            " --location ", cluster.location, " --project ", config.project, " --dns-endpoint",
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
    export_run_outputs(config, runs)
    if platform.monitoring:
        pulumi.export("dashboardUrl", platform.monitoring.dashboard_url)


def deploy_serving(platform: Platform, runs: list[TrainingRun]) -> None:
    """gemma-tpu:serving: its pool, identity and image mirror, then vLLM on the served run's export,
    and the outputs that reach it (docs/serving.md)."""
    config = platform.config
    cloud = ServingInfra("serving", config, platform.cluster, platform.identity, platform.buckets,
                         after=platform.apis.services, opts=pulumi.ResourceOptions(providers=[platform.gcp_provider]))  # fmt: skip
    (run,) = [run for run_config, run in zip(config.runs, runs) if run_config.name == config.serving.run]
    served = ServingDeployment("serving", config=config, run=run, provider=platform.kubernetes_provider,
                               after=[platform.namespace, cloud.identity.service_account, *cloud.ready], listed=cloud.published,
                               read=cloud.object_text)  # fmt: skip
    pulumi.export("serving", served.commands.apply(lambda commands: {**commands, "model": config.serving.run}))
    pulumi.export("servingSmoke", served.smoke if served.smoke is not None else "no replicas: scale up to get an answer")


def declare_stack(config: StackConfig) -> None:
    """The whole stack: the platform, then what runs on it, then the outputs."""
    platform = build(config)
    runs = deploy_runs(platform)
    export_outputs(platform, runs)
    if config.serving is not None:
        deploy_serving(platform, runs)
