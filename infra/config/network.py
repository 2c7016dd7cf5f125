"""gemma-tpu:network: the stack's own VPC and its ranges, or an existing network named in config."""

import ipaddress
import itertools
from dataclasses import dataclass

from infra.config.cluster import CPU_POOL_NODES
from infra.config.sections import Section
from infra.errors import ConfigError

# The stack's own subnet: nodes, and its secondary ranges for pods (a /14: GKE gives each node a /24)
# and services. Private (RFC 1918) and disjoint; override them to fit a peered network.
DEFAULT_NODE_CIDR = "10.0.0.0/20"
DEFAULT_POD_CIDR = "10.4.0.0/14"
DEFAULT_SERVICE_CIDR = "10.8.0.0/20"


@dataclass(frozen=True, kw_only=True)
class NetworkConfig:
    """The VPC the cluster's nodes live in: the stack's own (`name` None: created with its subnet,
    Cloud Router and NAT) or an existing one, such as a shared VPC, named in config."""

    name: str | None
    subnetwork: str | None
    node_cidr: str  # the stack's own subnet: node addresses
    pod_cidr: str  # its secondary range for pods
    service_cidr: str  # and for services
    pod_range_name: str  # the subnet's secondary range names (an existing subnet's, as named there)
    service_range_name: str

    @property
    def owned(self) -> bool:
        return self.name is None


def parse_network(section: Section) -> NetworkConfig:
    name = section.text("name", "") or None
    subnetwork = section.text("subnetwork", "") or None
    cidrs = {key: section.text(key, default) for key, default in
             (("nodeCidr", DEFAULT_NODE_CIDR), ("podCidr", DEFAULT_POD_CIDR), ("serviceCidr", DEFAULT_SERVICE_CIDR))}  # fmt: skip
    pod_range = section.text("podRangeName", "")
    service_range = section.text("serviceRangeName", "")
    if (name is None) != (subnetwork is None):
        raise ConfigError(
            f"{section.key('name')} and {section.key('subnetwork')} go together: name an existing network and its "
            "subnetwork, or leave both empty for the stack's own network"
        )
    if name is None:
        if pod_range or service_range:
            raise ConfigError(f"{section.key('podRangeName')} and {section.key('serviceRangeName')} name an existing "
                              f"subnetwork's ranges; set {section.key('name')} and {section.key('subnetwork')} too, or remove them")
        _check_cidrs(section, cidrs)
        return NetworkConfig(name=None, subnetwork=None, node_cidr=cidrs["nodeCidr"], pod_cidr=cidrs["podCidr"],
                             service_cidr=cidrs["serviceCidr"], pod_range_name="pods", service_range_name="services")  # fmt: skip
    if name == "default":
        raise ConfigError(f"{section.key('name')} is 'default', the project's auto-mode network with open firewall "
                          "rules; leave it empty for the stack's own network or name a network made for the cluster")
    if not (pod_range and service_range):
        raise ConfigError(f"{section.key('podRangeName')} and {section.key('serviceRangeName')} are required with an "
                          f"existing network: the secondary ranges of {subnetwork} for pods and services")
    return NetworkConfig(name=name, subnetwork=subnetwork, node_cidr="", pod_cidr="", service_cidr="",
                         pod_range_name=pod_range, service_range_name=service_range)  # fmt: skip


# GKE gives each node of a Standard cluster a /24 of the pod range (110 pods a node, the default:
# cloud.google.com/kubernetes-engine/docs/concepts/alias-ips#cluster_sizing), and a subnet's
# primary range loses four addresses to Google Cloud (cloud.google.com/vpc/docs/subnets#reserved_ip_addresses_in_every_subnet).
_NODE_POD_PREFIX = 24
_SUBNET_RESERVED_ADDRESSES = 4


def check_network_size(section: Section, network: NetworkConfig, *, tpu_pools: int, hosts_per_pool: int) -> None:
    """A Standard cluster's own ranges hold its nodes at their largest (the CPU pool's and the TPU
    pools' maximum, one surge node a pool during an upgrade): a node address each, and a /24 of pod
    addresses each. Past that the autoscaler cannot add a TPU host and a slice never comes up whole."""
    if not network.owned:
        return
    nodes = CPU_POOL_NODES[1] + 1 + tpu_pools * (hosts_per_pool + 1)
    node_range, pod_range = ipaddress.ip_network(network.node_cidr), ipaddress.ip_network(network.pod_cidr)
    pod_blocks = 2 ** (_NODE_POD_PREFIX - pod_range.prefixlen) if pod_range.prefixlen <= _NODE_POD_PREFIX else 0
    if pod_blocks < nodes:
        raise ConfigError(f"{section.key('podCidr')} {pod_range} holds pod ranges for {pod_blocks} nodes (a /24 each), but the "
                          f"stack's node pools reach {nodes} nodes; give it a /{_NODE_POD_PREFIX - (nodes - 1).bit_length()} or larger")
    addresses = node_range.num_addresses - _SUBNET_RESERVED_ADDRESSES
    if addresses < nodes:
        raise ConfigError(f"{section.key('nodeCidr')} {node_range} holds {addresses} node addresses, but the stack's node pools "
                          f"reach {nodes} nodes; give it a /{32 - (nodes + _SUBNET_RESERVED_ADDRESSES - 1).bit_length()} or larger")


def _check_cidrs(section: Section, cidrs: dict[str, str]) -> None:
    networks = {}
    for key, text in cidrs.items():
        try:
            network = ipaddress.ip_network(text)
        except ValueError:
            raise ConfigError(f"{section.key(key)} is {text!r}, not an IPv4 range such as 10.0.0.0/20") from None
        if network.version != 4 or not network.is_private:
            raise ConfigError(f"{section.key(key)} is {text!r}; use a private IPv4 range (10/8, 172.16/12, 192.168/16)")
        networks[key] = network
    for (key_a, a), (key_b, b) in itertools.combinations(networks.items(), 2):
        if a.overlaps(b):
            raise ConfigError(f"{section.key(key_a)} {a} overlaps {section.key(key_b)} {b}; give them disjoint ranges")
