"""The training runs as Pulumi resources: the dicts of workloads.manifests and workloads.preparation,
applied by the cluster's provider once the namespace, its ServiceAccounts, the JobSet controller (and
the queue) exist.

A stack without gemma-tpu:runs has one TrainingRun, `training`, holding its own data preparation.
With gemma-tpu:runs each run is `run-<name>` and each dataset's preparation `data-<key>`: adding a
run adds only its resources, removing one removes only its training object (and the preparation
of a dataset no run trains on any more), and a change to one run's settings replaces only it.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from infra.config import PROJECT, RunConfig, StackConfig
from workloads import manifests, preparation
from workloads.spec import PREPARE_DEADLINE_SECONDS, RunSpec, prepared_key, run_shape, run_spec


@dataclass(frozen=True, kw_only=True)
class RunPlatform:
    """What every run's objects are applied with and after: the cluster's provider, the namespace
    and both ServiceAccounts, the JobSet controller, `webhooks`, `after` (e.g. the IAM bindings
    that let each ServiceAccount's Google account mount the buckets) and, for training only,
    `training_after` (e.g. the TPU pools and the Kueue queue).

    `webhooks`: the controllers whose admission webhooks see every Job and pod of the namespace
    and refuse them while they cannot answer (Kueue registers its Job and Pod webhooks with
    failurePolicy Fail on every namespace but kube-system and kueue-system, and pulumi-kubernetes
    retries a create only on NotFound or NoMatch). Every object waits for them (Kueue's Deployment
    turns Ready once its webhook server listens: kueue v0.19.2 cmd/kueue/main.go
    setupProbeEndpoints), and `pulumi destroy` deletes every object before them."""

    provider: k8s.Provider
    namespace: pulumi.Resource
    service_account: pulumi.Resource
    preparation_service_account: pulumi.Resource
    jobset_install: pulumi.Resource
    webhooks: Sequence[pulumi.Resource] = ()
    after: Sequence[pulumi.Resource] = ()
    training_after: Sequence[pulumi.Resource] = ()

    @property
    def preparation_prerequisites(self) -> list[pulumi.Resource]:
        return [self.namespace, self.preparation_service_account, *self.webhooks, *self.after]

    @property
    def training_prerequisites(self) -> list[pulumi.Resource]:
        return [self.jobset_install, self.namespace, self.service_account, *self.webhooks, *self.after, *self.training_after]


def _apply(parent, name, obj, provider, *, depends_on, jobset=False, custom_timeouts=None) -> pulumi.Resource:
    opts = pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=depends_on, custom_timeouts=custom_timeouts)
    if jobset:
        return k8s.apiextensions.CustomResource(
            name, api_version=manifests.JOBSET_API_VERSION, kind="JobSet",
            metadata=obj["metadata"], spec=obj["spec"], opts=opts,
        )  # fmt: skip
    return k8s.batch.v1.Job(name, metadata=obj["metadata"], spec=obj["spec"], opts=opts)


def _apply_preparation(parent, spec: pulumi.Output[RunSpec], platform: RunPlatform) -> pulumi.Resource:
    """The dataset's preparation Job, awaited up to its deadline: a bad dataset URL fails `pulumi up`."""
    return _apply(
        parent, "prepare-data", spec.apply(preparation.preparation_job), platform.provider,
        depends_on=platform.preparation_prerequisites,
        custom_timeouts=pulumi.CustomTimeouts(create=f"{PREPARE_DEADLINE_SECONDS}s"),
    )  # fmt: skip


class DataPreparation(pulumi.ComponentResource):
    """The preparation Job of one dataset that several runs of gemma-tpu:runs train on; it stays
    while any run of that dataset does."""

    def __init__(self, name: str, *, spec: pulumi.Output[RunSpec], platform: RunPlatform,
                 opts: pulumi.ResourceOptions | None = None) -> None:  # fmt: skip
        super().__init__(f"{PROJECT}:workloads:DataPreparation", name, None, opts)
        self.job = _apply_preparation(self, spec, platform)
        self.register_outputs({})


class TrainingRun(pulumi.ComponentResource):
    """One run: its training Job or JobSet, after its data preparation (its own, or `preparation`'s)
    and the platform's prerequisites (RunPlatform).

    `pulumi up` awaits the preparation Job (up to its deadline), so a bad dataset URL fails the
    update, then creates the training object without waiting for it (`pulumi.com/skipAwait`: a
    run takes hours). The image reference is an output of the image build, so the objects are
    built from it inside `apply`; the resources themselves are declared up front and show in
    previews.
    """

    spec: pulumi.Output[RunSpec]
    run_name: pulumi.Output[str]
    logs_command: pulumi.Output[str]
    status_command: pulumi.Output[str]
    tensorboard_dir: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        *,
        config: StackConfig,
        run: RunConfig,
        image: pulumi.Input[str],
        platform: RunPlatform,
        preparation: DataPreparation | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{PROJECT}:workloads:TrainingRun", name, None, opts)
        self.spec = pulumi.Output.from_input(image).apply(lambda ref: run_spec(config, run, image=ref))
        prepare = preparation.job if preparation is not None else _apply_preparation(self, self.spec, platform)
        _apply(
            self, "training", self.spec.apply(manifests.training), platform.provider,
            depends_on=[prepare, *platform.training_prerequisites], jobset=run_shape(config, run) == "jobset",
        )  # fmt: skip
        self.run_name = self.spec.apply(lambda spec: spec.name)
        self.logs_command = self.spec.apply(manifests.logs_command)
        self.status_command = self.spec.apply(manifests.status_command)
        self.tensorboard_dir = self.spec.apply(lambda spec: spec.tensorboard_url)
        self.register_outputs(
            {"runName": self.run_name, "logsCommand": self.logs_command, "statusCommand": self.status_command, "tensorboardDir": self.tensorboard_dir}
        )


def training_runs(config: StackConfig, *, image: pulumi.Input[str], platform: RunPlatform) -> list[TrainingRun]:
    """The stack's runs (see the module docstring for their resource names)."""
    if not config.run_list:
        return [TrainingRun("training", config=config, run=config.runs[0], image=image, platform=platform)]
    preparations: dict[str, DataPreparation] = {}
    for run in config.runs:
        key = prepared_key(run)
        if key not in preparations:
            spec = pulumi.Output.from_input(image).apply(lambda ref, run=run: run_spec(config, run, image=ref))
            preparations[key] = DataPreparation(f"data-{key}", spec=spec, platform=platform)
    return [
        TrainingRun(f"run-{run.name}", config=config, run=run, image=image, platform=platform,
                    preparation=preparations[prepared_key(run)])  # fmt: skip
        for run in config.runs
    ]
