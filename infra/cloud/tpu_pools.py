"""One GKE node pool per TPU slice, shaped by the catalog (infra.catalog.tpu) and the capacity choice."""

from collections.abc import Sequence

import pulumi
import pulumi_gcp as gcp

from infra.catalog.names import tpu_pool_names
from infra.cloud.cluster import CLOUD_PLATFORM_SCOPE, NODE_IMAGE, GkeCluster, gke_metadata, image_streaming
from infra.cloud.component import Component
from infra.config import StackConfig

RESERVATION_KEY = "compute.googleapis.com/reservation-name"


class TpuPools(Component):
    """`pools`: one node pool per slice on a Standard cluster, none on Autopilot (GKE provisions
    TPU nodes there from the pods' selectors)."""

    def __init__(self, name: str, config: StackConfig, cluster: GkeCluster, *, after: Sequence[pulumi.Resource] = (), opts=None):
        super().__init__("TpuPools", name, after=after, opts=opts)
        self.pools: list[gcp.container.NodePool] = []
        if config.cluster_mode == "standard":
            self.pools = [self._pool(config, cluster, name) for name in tpu_pool_names(config.tpu.slices)]
        self.register_outputs({"pools": [pool.name for pool in self.pools]})

    def _pool(self, config: StackConfig, cluster: GkeCluster, pool_name: str) -> gcp.container.NodePool:
        spec = config.slice
        flex_start = config.tpu.capacity == "flex-start"
        return scale_from_zero_pool(
            pool_name, config, cluster, machine_type=spec.machine_type, max_nodes=spec.hosts, spot=config.tpu.capacity == "spot",
            # Flex-start nodes are not repaired: a broken node is given back, not recreated.
            auto_repair=not flex_start, location_policy="ANY" if flex_start else None,
            # the autoscaler brings up a multi-host slice's hosts together, atomically
            placement_policy=gcp.container.NodePoolPlacementPolicyArgs(type="COMPACT", tpu_topology=spec.topology)
            if spec.multi_host
            else None,
            # With Kueue in front (gemma-tpu:queue), a flex-start pool is a queued provisioning
            # pool: nodes come only for a run Kueue admitted, through its ProvisioningRequest.
            queued_provisioning=gcp.container.NodePoolQueuedProvisioningArgs(enabled=True) if config.queued_provisioning else None,
            flex_start=flex_start or None, reservation_affinity=_reservation_affinity(config), opts=self.child(*cluster.ready),
        )  # fmt: skip


def scale_from_zero_pool(pool_name: str, config: StackConfig, cluster: GkeCluster, *, machine_type: str, max_nodes: int, spot: bool,
                         opts: pulumi.ResourceOptions, auto_repair: bool = True, location_policy: str | None = None,
                         placement_policy: gcp.container.NodePoolPlacementPolicyArgs | None = None,
                         queued_provisioning: gcp.container.NodePoolQueuedProvisioningArgs | None = None,
                         flex_start: bool | None = None, reservation_affinity=None,
                         taints: list[gcp.container.NodePoolNodeConfigTaintArgs] | None = None) -> gcp.container.NodePool:
    """A TPU node pool in the stack's zone (a slice's hosts sit together) that sits at zero nodes,
    billing nothing, until a pod asks for one, and grows to `max_nodes`; its nodes run as the cluster's
    node account with GKE's metadata server (Workload Identity) and stream their images. The training
    slices and the serving replicas differ only in the keyword arguments."""
    return gcp.container.NodePool(
        pool_name,
        gcp.container.NodePoolArgs(
            name=pool_name,
            cluster=cluster.cluster.name,
            location=config.cluster_location,
            node_locations=[config.zone],
            initial_node_count=0,
            autoscaling=gcp.container.NodePoolAutoscalingArgs(total_min_node_count=0, total_max_node_count=max_nodes,
                                                              location_policy=location_policy),
            placement_policy=placement_policy,
            queued_provisioning=queued_provisioning,
            management=gcp.container.NodePoolManagementArgs(auto_repair=auto_repair, auto_upgrade=True),
            node_config=gcp.container.NodePoolNodeConfigArgs(
                machine_type=machine_type,
                image_type=NODE_IMAGE,
                gcfs_config=image_streaming(),
                service_account=cluster.node_service_account.email,
                oauth_scopes=[CLOUD_PLATFORM_SCOPE],
                workload_metadata_config=gke_metadata(),
                spot=spot or None,
                flex_start=flex_start,
                reservation_affinity=reservation_affinity,
                taints=taints,
            ),
        ),
        opts=opts,
    )  # fmt: skip


def _reservation_affinity(config: StackConfig) -> gcp.container.NodePoolNodeConfigReservationAffinityArgs | None:
    if config.tpu.capacity == "reservation":
        return gcp.container.NodePoolNodeConfigReservationAffinityArgs(
            consume_reservation_type="SPECIFIC_RESERVATION", key=RESERVATION_KEY, values=[config.tpu.reservation]
        )
    if config.tpu.capacity == "flex-start":
        return gcp.container.NodePoolNodeConfigReservationAffinityArgs(consume_reservation_type="NO_RESERVATION")
    return None
