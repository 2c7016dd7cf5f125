"""The training run as Pulumi resources: the dicts of workloads.manifests, applied by the cluster's
provider once the namespace, its ServiceAccount and the JobSet controller exist."""

from collections.abc import Sequence

import pulumi
import pulumi_kubernetes as k8s

from infra.config import PROJECT, StackConfig
from workloads import manifests
from workloads.spec import PREPARE_DEADLINE_SECONDS, RunSpec, run_shape, run_spec


class TrainingRun(pulumi.ComponentResource):
    """Data preparation, then the training Job or JobSet.

    Both come after `namespace` and `after` (e.g. the IAM bindings that let each ServiceAccount's
    Google account mount the buckets); data preparation also after `preparation_service_account`,
    training after `service_account`, `jobset_install` and `training_after` (e.g. the TPU pools).
    `pulumi up` awaits the preparation Job (up to its deadline), so a bad dataset URL fails the
    update, then creates the training object without waiting for it (`pulumi.com/skipAwait`: a run
    takes hours). The image reference is an output of the image build, so the objects are built
    from it inside `apply`; the resources themselves are declared up front and show in previews.
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
        image: pulumi.Input[str],
        provider: k8s.Provider,
        namespace: pulumi.Resource,
        service_account: pulumi.Resource,
        preparation_service_account: pulumi.Resource,
        jobset_install: pulumi.Resource,
        after: Sequence[pulumi.Resource] = (),
        training_after: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{PROJECT}:workloads:TrainingRun", name, None, opts)
        self.spec = pulumi.Output.from_input(image).apply(lambda ref: run_spec(config, image=ref))
        prepare = self._apply(
            "prepare-data",
            self.spec.apply(manifests.preparation_job),
            provider,
            depends_on=[namespace, preparation_service_account, *after],
            custom_timeouts=pulumi.CustomTimeouts(create=f"{PREPARE_DEADLINE_SECONDS}s"),
        )
        self._apply(
            "training",
            self.spec.apply(manifests.training),
            provider,
            depends_on=[prepare, jobset_install, namespace, service_account, *after, *training_after],
            jobset=run_shape(config) == "jobset",
        )
        self.run_name = self.spec.apply(lambda spec: spec.name)
        self.logs_command = self.spec.apply(manifests.logs_command)
        self.status_command = self.spec.apply(manifests.status_command)
        self.tensorboard_dir = self.spec.apply(lambda spec: spec.tensorboard_url)
        self.register_outputs(
            {"runName": self.run_name, "logsCommand": self.logs_command, "statusCommand": self.status_command, "tensorboardDir": self.tensorboard_dir}
        )

    def _apply(self, name, obj, provider, *, depends_on, jobset=False, custom_timeouts=None) -> pulumi.Resource:
        opts = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=depends_on, custom_timeouts=custom_timeouts)
        if jobset:
            return k8s.apiextensions.CustomResource(
                name, api_version=manifests.JOBSET_API_VERSION, kind="JobSet",
                metadata=obj["metadata"], spec=obj["spec"], opts=opts,
            )  # fmt: skip
        return k8s.batch.v1.Job(name, metadata=obj["metadata"], spec=obj["spec"], opts=opts)
