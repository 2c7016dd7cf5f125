"""The JobSet controller (kubernetes-sigs/jobset) at a pinned release."""

from collections.abc import Sequence

import pulumi
import pulumi_kubernetes as k8s

from infra.cloud.cluster import GkeCluster
from infra.cloud.component import Component

JOBSET_VERSION = "v0.12.0"
JOBSET_MANIFESTS = f"https://github.com/kubernetes-sigs/jobset/releases/download/{JOBSET_VERSION}/manifests.yaml"


class JobSetController(Component):
    """`install`: the release manifests (CRD, controller in `jobset-system`, webhooks), applied
    server-side by the cluster's provider (the CRD is too large for client-side apply, jobset#536)
    once the CPU pool can run the controller."""

    def __init__(self, name: str, cluster: GkeCluster, *, after: Sequence[pulumi.Resource] = (), opts=None):
        super().__init__("JobSetController", name, after=after, opts=opts)
        self.install = k8s.yaml.v2.ConfigFile(
            "jobset",
            k8s.yaml.v2.ConfigFileArgs(file=JOBSET_MANIFESTS),
            opts=self.child(*cluster.ready, provider=cluster.provider),
        )
        self.register_outputs({"version": JOBSET_VERSION})
