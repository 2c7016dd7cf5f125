"""The workloads as Pulumi resources: the training runs (the dicts of workloads.manifests and
workloads.preparation), applied by the cluster's provider once the namespace, its ServiceAccounts, the
JobSet controller (and the queue) exist, and the serving (workloads.serving's) of the version that
`pulumi up` finds.

A stack without gemma-tpu:runs has one TrainingRun, `training`, holding its own data preparation.
With gemma-tpu:runs each run is `run-<name>` and each dataset's preparation `data-<key>`: adding a
run adds only its resources, removing one removes only its training object (and the preparation
of a dataset no run trains on any more), and a change to one run's settings replaces only it.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from infra.config import PROJECT, RunConfig, StackConfig
from trainer.contract import PUBLISHED_MARKER_FILE, holds_parts, published_marker
from workloads import manifests, preparation, serving
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


def marker_glob(published_dir: str) -> str:
    """The markers of every complete version, as a glob over the artifacts bucket's object names."""
    return f"{published_dir}/*/{PUBLISHED_MARKER_FILE}"


def versions_newest_first(published_dir: str, object_names) -> list[tuple[str, str]]:
    """(version, its marker's object name) of each complete version among the artifacts bucket's
    `object_names`, newest first (version names sort by time)."""
    prefix, suffix = f"{published_dir}/", f"/{PUBLISHED_MARKER_FILE}"
    versions = {name.removeprefix(prefix).removesuffix(suffix): name for name in object_names
                if name.startswith(prefix) and name.endswith(suffix)}  # fmt: skip
    return sorted(((version, name) for version, name in versions.items() if "/" not in version and not version.startswith(".")),
                  reverse=True)  # fmt: skip


def holds(marker: str | None, parts: tuple[str, ...], *, source: str, warn=None) -> bool:
    """Whether a version whose marker (object `source`) reads `marker` holds `parts` (trainer.hf.publish writes
    them in it); a marker that is not one holds nothing, and `warn` says so once."""
    read = published_marker(marker, source=source, warn=warn)
    return read is not None and holds_parts(read["parts"], parts)


class ServingDeployment(pulumi.ComponentResource):
    """The serving objects of workloads.serving, applied by the cluster's provider once the served run's
    object, the serving pool and the serving identity exist (`after`).

    `pulumi up` lists the run's published versions in the artifacts bucket (`listed(glob)`: the names
    of its objects that match) and serves the newest that holds what the serving needs (the merged
    model, or the base and the adapter), reading markers newest first (`read(name)`: an object's
    text); with none it applies the Deployment at zero replicas (no TPU node) and the smoke Job
    suspended, and says so. It does not wait for the Deployment (its rollout takes the pool's node and
    the first compile); when a version is served it waits for that version's smoke Job instead, so an
    update that ends well has had one chat request answered by that version itself (workloads.serving's
    smoke_script asks it by its own name). `smoke` says which version answered, None at zero replicas; `commands` are the user's (port-forward, curl, logs). The ServiceAccount is
    infra.cloud.identity's, from the same builder."""

    spec: pulumi.Output[serving.ServingSpec]
    commands: pulumi.Output[dict[str, str]]
    smoke: pulumi.Output[str] | None

    def __init__(self, name: str, *, config: StackConfig, run: TrainingRun, provider: k8s.Provider,
                 after: Sequence[pulumi.Resource], listed: Callable[[pulumi.Input[str]], pulumi.Output[list[str]]],
                 read: Callable[[str], pulumi.Output[str | None]], opts: pulumi.ResourceOptions | None = None) -> None:  # fmt: skip
        super().__init__(f"{PROJECT}:workloads:ServingDeployment", name, None, opts)

        def newest(candidates: list[tuple[str, str]]):
            """The first of `candidates` (version, marker) whose marker names the parts; None when none does."""
            if not candidates:
                return None
            (version, marker), rest = candidates[0], candidates[1:]
            return read(marker).apply(lambda text: version if holds(text, config.serving.parts, warn=pulumi.log.warn,
                                                                    source=f"gs://{config.artifacts_bucket}/{marker}") else newest(rest))

        names = listed(run.spec.apply(lambda run_spec: marker_glob(run_spec.publish_dir)))
        version = pulumi.Output.all(run.spec, names).apply(lambda found: newest(versions_newest_first(found[0].publish_dir, found[1])))
        self.spec = pulumi.Output.all(run.spec, version).apply(lambda found: serving.serving_spec(config, found[0], found[1]))

        def options(*depends_on: pulumi.Resource, **more) -> pulumi.ResourceOptions:
            return pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[*after, *depends_on], **more)

        deployment = self.spec.apply(serving.deployment)
        server = k8s.apps.v1.Deployment("vllm", metadata=deployment["metadata"], spec=deployment["spec"], opts=options())
        service = self.spec.apply(serving.service)
        k8s.core.v1.Service("vllm", metadata=service["metadata"], spec=service["spec"], opts=options())
        monitoring = self.spec.apply(serving.pod_monitoring)
        k8s.apiextensions.CustomResource(
            "vllm-metrics", api_version="monitoring.googleapis.com/v1", kind="PodMonitoring",
            metadata=monitoring["metadata"], spec=monitoring["spec"], opts=options(),
        )  # fmt: skip
        if config.serving.autoscaled:
            autoscaler = self.spec.apply(serving.autoscaler)
            k8s.autoscaling.v2.HorizontalPodAutoscaler("vllm", metadata=autoscaler["metadata"], spec=autoscaler["spec"],
                                                       opts=options(server))  # fmt: skip
        self.smoke = None
        if config.serving.replicas:
            smoke = self.spec.apply(serving.smoke_job)
            (skip_await,) = manifests.SKIP_AWAIT
            metadata = pulumi.Output.all(smoke["metadata"], self.spec).apply(
                lambda parts: parts[0] | {"annotations": {skip_await: "false" if parts[1].serving else "true"}})
            # A new version's Job has a new name: the old one is replaced, and the new one asks again.
            job = k8s.batch.v1.Job(
                "vllm-smoke", metadata=metadata, spec=smoke["spec"],
                opts=options(server, custom_timeouts=pulumi.CustomTimeouts(create=f"{serving.SMOKE_AWAIT_SECONDS}s",
                                                                           update=f"{serving.SMOKE_AWAIT_SECONDS}s")),
            )  # fmt: skip
            # The Job's id exists once `pulumi up` has created it: awaited to its answer when a version
            # is served (a failed Job fails the update), else left suspended.
            self.smoke = pulumi.Output.all(job.id, self.spec).apply(lambda done: _smoke_line(done[1]))
        self.commands = self.spec.apply(serving.serving_commands)
        self.register_outputs({"commands": self.commands, "smoke": self.smoke})


def _smoke_line(spec: serving.ServingSpec) -> str:
    logs = serving.serving_commands(spec)["smokeLogs"]
    if spec.serving:
        return f"answered by {spec.served_version} itself (asked as {spec.version_model}); read the answer with: {logs}"
    return (f"no version answered yet: none in gs://{spec.artifacts_bucket}/{spec.published_dir} holds {' and '.join(spec.parts)} "
            "(the run publishes its export when it ends): no replicas, no TPU node; pulumi up again once one does")
