"""Kueue (kubernetes-sigs/kueue) at a pinned release, and the stack's queue on it (infra.queueing.queues)."""

from collections.abc import Sequence
import pulumi
import pulumi_kubernetes as k8s

from infra.cloud.cluster import GkeCluster
from infra.cloud.component import Component
from infra.config import StackConfig
from infra.queueing.queues import queue_objects

# v0.19 serves kueue.x-k8s.io/v1beta2 (the objects of infra.queueing.queues), runs JobSets through its
# jobset integration (on in the release's configuration) and has waitForPodsReady on by default.
KUEUE_VERSION = "v0.19.2"
KUEUE_MANIFESTS = f"https://github.com/kubernetes-sigs/kueue/releases/download/{KUEUE_VERSION}/manifests.yaml"


class KueueQueue(Component):
    """`install`: the release manifests (CRDs, the controller in `kueue-system`, its webhooks),
    applied server-side once the CPU pool can run the controller and JobSet's CRD exists (Kueue
    enables its JobSet integration at start). Then `objects`, a group of the flavor, priorities, quota and the
    training namespace's LocalQueue. `pulumi destroy` removes the queue objects (after the runs
    queued in it) before Kueue itself."""

    def __init__(self, name: str, config: StackConfig, cluster: GkeCluster, *, after: Sequence[pulumi.Resource] = (), opts=None):
        super().__init__("KueueQueue", name, after=after, opts=opts)
        self.install = k8s.yaml.v2.ConfigFile(
            "kueue",
            k8s.yaml.v2.ConfigFileArgs(file=KUEUE_MANIFESTS),
            opts=self.child(*cluster.ready, provider=cluster.provider),
        )
        # One group: a WorkloadPriorityClass has top-level fields, which CustomResource cannot carry.
        self.objects = k8s.yaml.v2.ConfigGroup(
            "queue",
            k8s.yaml.v2.ConfigGroupArgs(objs=queue_objects(config)),
            opts=self.child(self.install, provider=cluster.provider),
        )
        self.register_outputs({"version": KUEUE_VERSION})
