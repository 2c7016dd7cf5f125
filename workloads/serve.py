"""The serving objects as Pulumi resources: the dicts of workloads.serving, applied by the cluster's
provider once the served run's object, the serving pool and the serving identity exist.

`pulumi up` does not wait for the Deployment (its rollout takes the pool's node and the first
compile); it waits for the smoke Job instead, up to that Job's deadline, so an update that ends well
has had one chat request answered. Its ServiceAccount is infra.identity's, from the same builder.
"""

from collections.abc import Sequence

import pulumi
import pulumi_kubernetes as k8s

from infra.config import PROJECT, StackConfig
from workloads import serving
from workloads.deploy import TrainingRun


class ServingDeployment(pulumi.ComponentResource):
    """`spec` and the user's `commands` (port-forward, curl, logs); `smoke` is the smoke Job's
    outcome, None at zero replicas."""

    spec: pulumi.Output[serving.ServingSpec]
    commands: pulumi.Output[dict[str, str]]
    smoke: pulumi.Output[str] | None

    def __init__(self, name: str, *, config: StackConfig, run: TrainingRun, provider: k8s.Provider,
                 after: Sequence[pulumi.Resource], opts: pulumi.ResourceOptions | None = None) -> None:  # fmt: skip
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
            smoke = self._built(serving.smoke_job)
            job = k8s.batch.v1.Job(
                "vllm-smoke", metadata=smoke["metadata"], spec=smoke["spec"],
                opts=options(server, custom_timeouts=pulumi.CustomTimeouts(create=f"{serving.SMOKE_DEADLINE_SECONDS}s")),
            )  # fmt: skip
            # The Job's id exists once `pulumi up` has awaited it to completion (a failed Job fails the update).
            self.smoke = pulumi.Output.all(job.id, self.spec).apply(
                lambda done: f"answered; read the answer with: {serving.serving_commands(done[1])['smokeLogs']}")
        self.commands = self.spec.apply(serving.serving_commands)
        self.register_outputs({"commands": self.commands, "smoke": self.smoke})

    def _built(self, builder) -> pulumi.Output[dict]:
        return self.spec.apply(builder)

