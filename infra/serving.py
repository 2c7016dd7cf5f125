"""What serving (gemma-tpu:serving) needs from the cloud: a TPU node pool of the serving slice that
sits at zero nodes until a replica asks for one, a Google account that may only read the artifacts
bucket, acting as the serving pods' ServiceAccount, and, for a Docker Hub image, an Artifact
Registry remote repository of Docker Hub that the nodes pull it through (from the cluster's region,
as they pull the trainer), and, with autoscaling, the metrics adapter its autoscaler reads
(infra.observability.metrics_adapter)."""

from collections.abc import Sequence

import pulumi
import pulumi_gcp as gcp

from infra.cloud.cluster import GkeCluster
from infra.cloud.component import Component, service_account_member
from infra.cloud.identity import READ_ROLE, PodIdentity, TrainingIdentity
from infra.cloud.storage import Buckets
from infra.cloud.tpu_pools import scale_from_zero_pool
from infra.config import StackConfig
from infra.config.serving import SERVING_NAME, SERVING_POOL, SERVING_TAINT, docker_hub_path, mirror_repository_id, serving_account_id
from infra.observability.metrics_adapter import MetricsAdapter


class ServingInfra(Component):
    """`pool` (None on Autopilot, which provisions from the pods' selectors), `identity` (PodIdentity),
    `mirror` (None unless the image is on Docker Hub) and `metrics_adapter` (None without autoscaling);
    `ready` is what the serving objects wait for, the autoscaler included."""

    def __init__(self, name: str, config: StackConfig, cluster: GkeCluster, identity: TrainingIdentity, buckets: Buckets, *,
                 after: Sequence[pulumi.Resource] = (), opts=None):  # fmt: skip
        super().__init__("ServingInfra", name, after=after, opts=opts)
        serving = config.serving
        self.pool = self._pool(config, cluster) if config.cluster_mode == "standard" else None
        # One binding only: objectViewer on the artifacts bucket, where the runs' exports are.
        self.identity: PodIdentity = identity.pod_identity(
            "serving", account_id=serving_account_id(config.cluster_name), description="Serving pods", service_account=SERVING_NAME,
            grants=(("reads-artifacts", buckets.artifacts, READ_ROLE),),
        )  # fmt: skip
        self.mirror = None
        pulls: list[pulumi.Resource] = []
        if any(docker_hub_path(image) is not None for image in (serving.image, serving.smoke_image)):
            self.mirror = gcp.artifactregistry.Repository(
                "docker-hub",
                gcp.artifactregistry.RepositoryArgs(
                    repository_id=mirror_repository_id(config.cluster_name),
                    location=config.region,
                    format="DOCKER",
                    mode="REMOTE_REPOSITORY",
                    description=f"Docker Hub images (vLLM, the smoke request's python) of the {config.stack} stack, cached beside the cluster",
                    remote_repository_config=gcp.artifactregistry.RepositoryRemoteRepositoryConfigArgs(
                        description="Docker Hub",
                        docker_repository=gcp.artifactregistry.RepositoryRemoteRepositoryConfigDockerRepositoryArgs(
                            public_repository="DOCKER_HUB"
                        ),
                    ),
                ),
                opts=self.child(),
            )
            pulls.append(gcp.artifactregistry.RepositoryIamMember(
                "nodes-pull-docker-hub",
                gcp.artifactregistry.RepositoryIamMemberArgs(
                    repository=self.mirror.repository_id, location=config.region, role="roles/artifactregistry.reader",
                    member=service_account_member(cluster.node_service_account),
                ),
                opts=self.child(),
            ))  # fmt: skip
        self.metrics_adapter = None
        if serving.autoscaled:
            self.metrics_adapter = MetricsAdapter("metrics-adapter", config, cluster, after=after, opts=pulumi.ResourceOptions(parent=self))
        self.ready: list[pulumi.Resource] = [*([self.pool] if self.pool else []), *self.identity.bindings, *pulls,
                                             *([self.metrics_adapter.install] if self.metrics_adapter else [])]  # fmt: skip
        self._artifacts = buckets.artifacts
        self.register_outputs({"pool": self.pool.name if self.pool else None, "account": self.identity.google_service_account.email})

    def published(self, glob: pulumi.Input[str]) -> pulumi.Output[list[str]]:
        """The names of the artifacts bucket's objects that match `glob`, as read during `pulumi up`
        (once the bucket exists)."""
        found = gcp.storage.get_bucket_objects_output(
            bucket=self._artifacts.name, match_glob=glob,
            opts=pulumi.InvokeOutputOptions(parent=self, depends_on=[self._artifacts]),
        )  # fmt: skip
        return found.bucket_objects.apply(lambda objects: [found["name"] for found in objects or []])  # output types are dicts

    def object_text(self, name: str) -> pulumi.Output[str | None]:
        """The text of the artifacts bucket's object `name` (a version's marker), as read during `pulumi up`."""
        found = gcp.storage.get_bucket_object_content_output(
            bucket=self._artifacts.name, name=name, opts=pulumi.InvokeOutputOptions(parent=self, depends_on=[self._artifacts]))
        return found.content

    def _pool(self, config: StackConfig, cluster: GkeCluster) -> gcp.container.NodePool:
        """One single-host slice a replica, from zero nodes up to the most replicas there can be and one
        more, for the new pod of a rolling update; the vLLM image is large, and image streaming starts
        the server before all of it is there."""
        serving = config.serving
        return scale_from_zero_pool(
            SERVING_POOL, config, cluster, machine_type=serving.slice.machine_type, max_nodes=max(1, serving.max_replicas) + 1,
            spot=serving.capacity == "spot", taints=[gcp.container.NodePoolNodeConfigTaintArgs(**SERVING_TAINT, effect="NO_SCHEDULE")],
            opts=self.child(*cluster.ready),
        )  # fmt: skip
