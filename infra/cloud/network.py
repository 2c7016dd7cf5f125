"""The network the cluster's nodes live in. Nodes have no external addresses, so a stack-owned
network comes with a Cloud Router and Cloud NAT: pods still reach the dataset URL and the image
registry, and nothing on the internet reaches them. An existing network (a shared VPC) is only
referred to: its owners provide its egress."""

from collections.abc import Sequence

import pulumi
import pulumi_gcp as gcp

from infra.cloud.component import Component
from infra.config import StackConfig


class StackNetwork(Component):
    """`network` and `subnetwork` (names or self links the cluster takes), and `ready`: what the
    cluster waits for (the NAT of a stack-owned network, so that `pulumi destroy` removes the
    cluster before the network, router and NAT)."""

    def __init__(self, name: str, config: StackConfig, *, after: Sequence[pulumi.Resource] = (), opts=None):
        super().__init__("StackNetwork", name, after=after, opts=opts)
        settings = config.network
        self.ready: list[pulumi.Resource] = []
        if not settings.owned:
            self.network: pulumi.Input[str] = settings.name
            self.subnetwork: pulumi.Input[str] = settings.subnetwork
            self.register_outputs({"network": settings.name, "subnetwork": settings.subnetwork})
            return
        network = gcp.compute.Network(
            "network",
            gcp.compute.NetworkArgs(name=config.cluster_name, auto_create_subnetworks=False, routing_mode="REGIONAL"),
            opts=self.child(),
        )
        subnetwork = gcp.compute.Subnetwork(
            "subnetwork",
            gcp.compute.SubnetworkArgs(
                name=config.cluster_name,
                region=config.region,
                network=network.id,
                ip_cidr_range=settings.node_cidr,
                # Nodes without external addresses still reach Google APIs (Artifact Registry,
                # Cloud Storage) directly.
                private_ip_google_access=True,
                secondary_ip_ranges=[
                    gcp.compute.SubnetworkSecondaryIpRangeArgs(range_name=settings.pod_range_name, ip_cidr_range=settings.pod_cidr),
                    gcp.compute.SubnetworkSecondaryIpRangeArgs(range_name=settings.service_range_name, ip_cidr_range=settings.service_cidr),
                ],
            ),
            opts=self.child(),
        )
        router = gcp.compute.Router(
            "router", gcp.compute.RouterArgs(name=config.cluster_name, region=config.region, network=network.id), opts=self.child()
        )
        nat = gcp.compute.RouterNat(
            "nat",
            gcp.compute.RouterNatArgs(
                name=config.cluster_name,
                router=router.name,
                region=config.region,
                nat_ip_allocate_option="AUTO_ONLY",
                source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
                log_config=gcp.compute.RouterNatLogConfigArgs(enable=True, filter="ERRORS_ONLY"),
            ),
            opts=self.child(),
        )
        self.network, self.subnetwork = network.id, subnetwork.id
        self.ready = [subnetwork, nat]
        self.register_outputs({"network": network.name, "subnetwork": subnetwork.name})
