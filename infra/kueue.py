"""Kueue (kubernetes-sigs/kueue) at a pinned release, and the stack's queue on it (infra.queues)."""

from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.cluster import GkeCluster
from infra.component import Component
from infra.config import StackConfig
from infra.queues import queue_objects

# v0.19 serves kueue.x-k8s.io/v1beta2 (the objects of infra.queues), runs JobSets through its
# jobset integration (on in the release's configuration) and has waitForPodsReady on by default.
KUEUE_VERSION = "v0.19.2"
KUEUE_MANIFESTS = f"https://github.com/kubernetes-sigs/kueue/releases/download/{KUEUE_VERSION}/manifests.yaml"


def _custom_resource(obj: dict[str, Any], opts: pulumi.ResourceOptions) -> k8s.apiextensions.CustomResource:
    # Every top-level field but the type and name: `spec`, or a WorkloadPriorityClass's `value`.
    fields = {key: value for key, value in obj.items() if key not in ("apiVersion", "kind", "metadata")}
    return k8s.apiextensions.CustomResource(
        f"{obj['kind'].lower()}-{obj['metadata']['name']}",
        api_version=obj["apiVersion"], kind=obj["kind"], metadata=obj["metadata"], opts=opts, **fields,
    )  # fmt: skip


class KueueQueue(Component):
    """`install`: the release manifests (CRDs, the controller in `kueue-system`, its webhooks),
    applied server-side once the CPU pool can run the controller and JobSet's CRD exists (Kueue
    enables its JobSet integration at start). Then `objects`: the flavor, priorities, quota and the
    training namespace's LocalQueue. `pulumi destroy` removes the queue objects (after the runs
    queued in it) before Kueue itself."""

    def __init__(self, name: str, config: StackConfig, cluster: GkeCluster, *, after: Sequence[pulumi.Resource] = (), opts=None):
        super().__init__("KueueQueue", name, after=after, opts=opts)
        self.install = k8s.yaml.v2.ConfigFile(
            "kueue",
            k8s.yaml.v2.ConfigFileArgs(file=KUEUE_MANIFESTS),
            opts=self.child(*cluster.ready, provider=cluster.provider),
        )
        on_kueue = self.child(self.install, provider=cluster.provider)
        self.objects = [_custom_resource(obj, on_kueue) for obj in queue_objects(config)]
        self.register_outputs({"version": KUEUE_VERSION, "objects": [obj.metadata["name"] for obj in self.objects]})
