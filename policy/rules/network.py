"""GKE network exposure: nodes without external addresses, a control plane not open to the internet,
and a cluster on a network made for it (never the project's `default`, whose firewall admits SSH and
RDP from anywhere)."""

import ipaddress
from collections.abc import Mapping
from typing import Any

from rules.base import ResourceRule, as_list, dig
from rules.gke import CLUSTER, NODE_POOL


def check_private_nodes(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    if resource_type == NODE_POOL and dig(props, "networkConfig", "enablePrivateNodes") is False:
        return ["node pool sets networkConfig.enablePrivateNodes: false, giving its nodes external addresses; remove it"]
    if resource_type == CLUSTER and dig(props, "privateClusterConfig", "enablePrivateNodes") is not True:
        return ["cluster nodes get external addresses: set privateClusterConfig.enablePrivateNodes: true "
                "(with Cloud NAT for their egress)"]
    return []


def _is_everywhere(cidr: Any) -> bool:
    try:
        return ipaddress.ip_network(str(cidr), strict=False).prefixlen == 0
    except ValueError:
        return False


def check_control_plane_access(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    if resource_type != CLUSTER:
        return []
    authorized = props.get("masterAuthorizedNetworksConfig")
    if not isinstance(authorized, Mapping):
        return ["the control plane's IP endpoint admits every address: set masterAuthorizedNetworksConfig "
                "(an empty cidrBlocks list admits none; kubectl can use the DNS endpoint)"]
    problems = [f"masterAuthorizedNetworksConfig admits {dig(block, 'cidrBlock')}, the whole internet; list your own ranges"
                for block in as_list(authorized.get("cidrBlocks")) if _is_everywhere(dig(block, "cidrBlock"))]
    if authorized.get("gcpPublicCidrsAccessEnabled") is True:
        problems.append("masterAuthorizedNetworksConfig.gcpPublicCidrsAccessEnabled admits every Google Cloud VM's "
                        "public address; set it to false")
    return problems


def check_cluster_network(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    if resource_type != CLUSTER:
        return []
    network = props.get("network")
    if network is None or str(network) == "default" or str(network).endswith("/networks/default"):
        return ["the cluster is on the project's default network: put it on a network of its own or a named "
                "shared VPC (network and subnetwork)"]
    return []


PRIVATE_NODES = ResourceRule(
    name="gke-private-nodes",
    description="GKE nodes have no external IP addresses (private nodes).",
    check=check_private_nodes,
)
CONTROL_PLANE_ACCESS = ResourceRule(
    name="gke-control-plane-not-public",
    description="The GKE control plane's IP endpoint is not open to 0.0.0.0/0 (authorized networks only).",
    check=check_control_plane_access,
)
CLUSTER_NETWORK = ResourceRule(
    name="gke-own-network",
    description="GKE clusters are on a stack-owned or named network, never the project's default network.",
    check=check_cluster_network,
)
