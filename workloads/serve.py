"""The serving objects as Pulumi resources: the dicts of workloads.serving, applied by the cluster's
provider once the served run's object, the serving pool and the serving identity exist.

`pulumi up` does not wait for the Deployment (its rollout takes the pool's node and the first
compile). When the run's export is already in the bucket it waits for the smoke Job instead, so an
update that ends well has had one chat request answered; while the run is still training it leaves
the Job waiting in the cluster, and says so. The ServiceAccount is infra.cloud.identity's, from the same builder.
"""

from collections.abc import Callable, Sequence

import pulumi
import pulumi_kubernetes as k8s

from infra.config import PROJECT, StackConfig
from workloads import serving
from workloads.manifests import SKIP_AWAIT

(SKIP_AWAIT_KEY,) = SKIP_AWAIT
from workloads.deploy import TrainingRun


class ServingDeployment(pulumi.ComponentResource):
    """`spec` and the user's `commands` (port-forward, curl, logs); `smoke` is the smoke Job's
    outcome, None at zero replicas."""

    spec: pulumi.Output[serving.ServingSpec]
    commands: pulumi.Output[dict[str, str]]
    smoke: pulumi.Output[str] | None

    def __init__(self, name: str, *, config: StackConfig, run: TrainingRun, provider: k8s.Provider,
                 after: Sequence[pulumi.Resource], written: Callable[[pulumi.Output[Sequence[str]]], pulumi.Output[bool]],
                 opts: pulumi.ResourceOptions | None = None) -> None:  # fmt: skip
        super().__init__(f"{PROJECT}:workloads:ServingDeployment", name, None, opts)
        self.spec = run.spec.apply(lambda run_spec: serving.serving_spec(config, run_spec))

        def options(*depends_on: pulumi.Resource, **more) -> pulumi.ResourceOptions:
            return pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[*after, *depends_on], **more)

        deployment = self._built(serving.deployment)
        server = k8s.apps.v1.Deployment("vllm", metadata=deployment["metadata"], spec=deployment["spec"], opts=options())
        service = self._built(serving.service)
        k8s.core.v1.Service("vllm", metadata=service["metadata"], spec=service["spec"], opts=options())
        monitoring = self._built(serving.pod_monitoring)
        k8s.apiextensions.CustomResource(
            "vllm-metrics", api_version="monitoring.googleapis.com/v1", kind="PodMonitoring",
            metadata=monitoring["metadata"], spec=monitoring["spec"], opts=options(),
        )  # fmt: skip
        if config.serving.autoscaled:
            autoscaler = self._built(serving.autoscaler)
            k8s.autoscaling.v2.HorizontalPodAutoscaler("vllm", metadata=autoscaler["metadata"], spec=autoscaler["spec"],
                                                       opts=options(server))  # fmt: skip
        self.smoke = None
        if config.serving.replicas:
            exported = written(self.spec.apply(lambda spec: list(spec.awaited_objects)))
            smoke = self._built(serving.smoke_job)
            metadata = pulumi.Output.all(smoke["metadata"], exported).apply(
                lambda parts: parts[0] | {"annotations": {SKIP_AWAIT_KEY: "false" if parts[1] else "true"}})
            job = k8s.batch.v1.Job(
                "vllm-smoke", metadata=metadata, spec=smoke["spec"],
                opts=options(server, custom_timeouts=pulumi.CustomTimeouts(create=f"{serving.SMOKE_AWAIT_SECONDS}s",
                                                                           update=f"{serving.SMOKE_AWAIT_SECONDS}s")),
            )  # fmt: skip
            # The Job's id exists once `pulumi up` has created it: awaited to its answer when the export
            # was there (a failed Job fails the update), else left waiting.
            self.smoke = pulumi.Output.all(job.id, self.spec, exported).apply(lambda done: _smoke_line(*done[1:]))
        self.commands = self.spec.apply(serving.serving_commands)
        self.register_outputs({"commands": self.commands, "smoke": self.smoke})

    def _built(self, builder) -> pulumi.Output[dict]:
        return self.spec.apply(builder)


def _smoke_line(spec: serving.ServingSpec, exported: bool) -> str:
    logs = serving.serving_commands(spec)["smokeLogs"]
    if exported:
        return f"answered; read the answer with: {logs}"
    files = ", ".join(f"gs://{spec.artifacts_bucket}/{name}" for name in spec.awaited_objects)
    return f"waiting for the run's export ({files}): the smoke Job asks once vLLM is up; read it with: {logs}, or pulumi up again to wait for it"

