"""The serving objects as Pulumi resources: the dicts of workloads.serving, applied by the cluster's
provider once the served run's object, the serving pool and the serving identity exist.

`pulumi up` lists the run's published versions in the artifacts bucket and serves the newest
complete one; with none it applies the Deployment at zero replicas (no TPU node) and the smoke Job
suspended, and says so. It does not wait for the Deployment (its rollout takes the pool's node and
the first compile); when a version is served it waits for the smoke Job instead, so an update that
ends well has had one chat request answered. The ServiceAccount is infra.cloud.identity's, from the same builder.
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
    outcome, None at zero replicas. `published(glob)` lists the artifacts bucket's objects matching `glob`."""

    spec: pulumi.Output[serving.ServingSpec]
    commands: pulumi.Output[dict[str, str]]
    smoke: pulumi.Output[str] | None

    def __init__(self, name: str, *, config: StackConfig, run: TrainingRun, provider: k8s.Provider,
                 after: Sequence[pulumi.Resource], published: Callable[[pulumi.Input[str]], pulumi.Output[list[str]]],
                 opts: pulumi.ResourceOptions | None = None) -> None:  # fmt: skip
        super().__init__(f"{PROJECT}:workloads:ServingDeployment", name, None, opts)
        glob = run.spec.apply(lambda run_spec: serving.marker_glob(run_spec.publish_dir))
        self.spec = pulumi.Output.all(run.spec, published(glob)).apply(
            lambda parts: serving.serving_spec(config, parts[0], serving.newest_version(parts[0].publish_dir, parts[1])))

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
            metadata = pulumi.Output.all(smoke["metadata"], self.spec).apply(
                lambda parts: parts[0] | {"annotations": {SKIP_AWAIT_KEY: "false" if parts[1].serving else "true"}})
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

    def _built(self, builder) -> pulumi.Output[dict]:
        return self.spec.apply(builder)


def _smoke_line(spec: serving.ServingSpec) -> str:
    logs = serving.serving_commands(spec)["smokeLogs"]
    if spec.serving:
        return f"answered by {spec.served_version}; read the answer with: {logs}"
    return (f"nothing published in gs://{spec.artifacts_bucket}/{spec.published_dir} yet (the run publishes its export when it "
            "ends): no replicas, no TPU node; pulumi up again once it has")

