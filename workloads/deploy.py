"""The training runs as Pulumi resources: the dicts of workloads.manifests, applied by the cluster's
provider once the namespace, its ServiceAccounts, the JobSet controller (and the queue) exist.

A stack without gemma-tpu:runs has one TrainingRun, `training`, holding its own data preparation.
With gemma-tpu:runs each run is `run-<name>` and each dataset's preparation `data-<key>`: adding a
run adds only its resources, removing one removes only its training object (and the preparation
of a dataset no run trains on any more), and a change to one run's settings replaces only it.
"""

from collections.abc import Sequence

import pulumi
import pulumi_kubernetes as k8s

from infra.config import PROJECT, RunConfig, StackConfig
from workloads import manifests
from workloads.spec import PREPARE_DEADLINE_SECONDS, RunSpec, prepared_key, run_shape, run_spec


def _apply(parent, name, obj, provider, *, depends_on, jobset=False, custom_timeouts=None) -> pulumi.Resource:
    opts = pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=depends_on, custom_timeouts=custom_timeouts)
    if jobset:
        return k8s.apiextensions.CustomResource(
            name, api_version=manifests.JOBSET_API_VERSION, kind="JobSet",
            metadata=obj["metadata"], spec=obj["spec"], opts=opts,
        )  # fmt: skip
    return k8s.batch.v1.Job(name, metadata=obj["metadata"], spec=obj["spec"], opts=opts)


def _apply_preparation(parent, spec: pulumi.Output[RunSpec], provider, *, depends_on) -> pulumi.Resource:
    """The dataset's preparation Job, awaited up to its deadline: a bad dataset URL fails `pulumi up`."""
    return _apply(
        parent, "prepare-data", spec.apply(manifests.preparation_job), provider, depends_on=depends_on,
        custom_timeouts=pulumi.CustomTimeouts(create=f"{PREPARE_DEADLINE_SECONDS}s"),
    )  # fmt: skip


class DataPreparation(pulumi.ComponentResource):
    """The preparation Job of one dataset that several runs of gemma-tpu:runs train on; it stays
    while any run of that dataset does."""

    def __init__(self, name: str, *, spec: pulumi.Output[RunSpec], provider: k8s.Provider,
                 depends_on: Sequence[pulumi.Resource], opts: pulumi.ResourceOptions | None = None) -> None:  # fmt: skip
        super().__init__(f"{PROJECT}:workloads:DataPreparation", name, None, opts)
        self.job = _apply_preparation(self, spec, provider, depends_on=list(depends_on))
        self.register_outputs({})


class TrainingRun(pulumi.ComponentResource):
    """One run: its training Job or JobSet, after its data preparation (its own, or `preparation`'s).

    Both come after `namespace` and `after` (e.g. the IAM bindings that let each ServiceAccount's
    Google account mount the buckets); data preparation also after `preparation_service_account`,
    training after `service_account`, `jobset_install`, `training_after` (e.g. the TPU pools and
    the Kueue queue). `pulumi up` awaits the preparation Job (up to its deadline), so a bad dataset
    URL fails the update, then creates the training object without waiting for it
    (`pulumi.com/skipAwait`: a run takes hours). The image reference is an output of the image
    build, so the objects are built from it inside `apply`; the resources themselves are declared
    up front and show in previews.
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
        provider: k8s.Provider,
        namespace: pulumi.Resource,
        service_account: pulumi.Resource,
        preparation_service_account: pulumi.Resource,
        jobset_install: pulumi.Resource,
        preparation: DataPreparation | None = None,
        after: Sequence[pulumi.Resource] = (),
        training_after: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{PROJECT}:workloads:TrainingRun", name, None, opts)
        self.spec = pulumi.Output.from_input(image).apply(lambda ref: run_spec(config, run, image=ref))
        prepare = (
            preparation.job
            if preparation is not None
            else _apply_preparation(self, self.spec, provider, depends_on=[namespace, preparation_service_account, *after])
        )
        _apply(
            self, "training", self.spec.apply(manifests.training), provider,
            depends_on=[prepare, jobset_install, namespace, service_account, *after, *training_after],
            jobset=run_shape(config, run) == "jobset",
        )  # fmt: skip
        self.run_name = self.spec.apply(lambda spec: spec.name)
        self.logs_command = self.spec.apply(manifests.logs_command)
        self.status_command = self.spec.apply(manifests.status_command)
        self.tensorboard_dir = self.spec.apply(lambda spec: spec.tensorboard_url)
        self.register_outputs(
            {"runName": self.run_name, "logsCommand": self.logs_command, "statusCommand": self.status_command, "tensorboardDir": self.tensorboard_dir}
        )


def training_runs(
    config: StackConfig,
    *,
    image: pulumi.Input[str],
    provider: k8s.Provider,
    namespace: pulumi.Resource,
    service_account: pulumi.Resource,
    preparation_service_account: pulumi.Resource,
    jobset_install: pulumi.Resource,
    after: Sequence[pulumi.Resource] = (),
    training_after: Sequence[pulumi.Resource] = (),
) -> list[TrainingRun]:
    """The stack's runs (see the module docstring for their resource names)."""
    accounts = dict(namespace=namespace, service_account=service_account, preparation_service_account=preparation_service_account)
    common = dict(config=config, image=image, provider=provider, jobset_install=jobset_install, after=after,
                  training_after=training_after, **accounts)  # fmt: skip
    if not config.run_list:
        return [TrainingRun("training", run=config.runs[0], **common)]
    preparations: dict[str, DataPreparation] = {}
    for run in config.runs:
        key = prepared_key(run)
        if key not in preparations:
            spec = pulumi.Output.from_input(image).apply(lambda ref, run=run: run_spec(config, run, image=ref))
            preparations[key] = DataPreparation(
                f"data-{key}", spec=spec, provider=provider, depends_on=[namespace, preparation_service_account, *after]
            )
    return [
        TrainingRun(f"run-{run.name}", run=run, preparation=preparations[prepared_key(run)], **common)
        for run in config.runs
    ]
