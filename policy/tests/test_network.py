import pytest

from rules.gke import CLUSTER, NODE_POOL
from rules.network import check_cluster_network, check_control_plane_access, check_private_nodes


def test_the_compliant_cluster_passes(graph_entry):
    props = graph_entry("cluster")["inputs"]
    assert check_private_nodes(CLUSTER, props) == check_control_plane_access(CLUSTER, props) == check_cluster_network(CLUSTER, props) == []


@pytest.mark.parametrize("private", [None, {}, {"enablePrivateNodes": False}])
def test_a_cluster_whose_nodes_get_external_addresses_is_reported(graph_entry, private):
    props = graph_entry("cluster")["inputs"]
    props["privateClusterConfig"] = private
    [problem] = check_private_nodes(CLUSTER, props)
    assert "enablePrivateNodes: true" in problem


def test_a_node_pool_that_opts_out_of_private_nodes_is_reported(graph_entry):
    props = graph_entry("tpu-slice-0")["inputs"]
    assert check_private_nodes(NODE_POOL, props) == []
    props["networkConfig"] = {"enablePrivateNodes": False}
    [problem] = check_private_nodes(NODE_POOL, props)
    assert "external addresses" in problem


@pytest.mark.parametrize("authorized, fragment", [
    (None, "admits every address"),
    ({"cidrBlocks": [{"cidrBlock": "0.0.0.0/0"}]}, "0.0.0.0/0, the whole internet"),
    ({"cidrBlocks": [{"cidrBlock": "203.0.113.0/24"}, {"cidrBlock": "::/0"}]}, "::/0, the whole internet"),
    ({"gcpPublicCidrsAccessEnabled": True}, "every Google Cloud VM"),
])
def test_a_control_plane_open_to_the_internet_is_reported(graph_entry, authorized, fragment):
    props = graph_entry("cluster")["inputs"]
    props["masterAuthorizedNetworksConfig"] = authorized
    [problem] = check_control_plane_access(CLUSTER, props)
    assert fragment in problem


def test_listed_ranges_are_fine(graph_entry):
    props = graph_entry("cluster")["inputs"]
    props["masterAuthorizedNetworksConfig"] = {"cidrBlocks": [{"cidrBlock": "203.0.113.0/24"}]}
    assert check_control_plane_access(CLUSTER, props) == []


@pytest.mark.parametrize("network", [None, "default", "projects/my-project/global/networks/default"])
def test_a_cluster_on_the_default_network_is_reported(graph_entry, network):
    props = graph_entry("cluster")["inputs"]
    props["network"] = network
    [problem] = check_cluster_network(CLUSTER, props)
    assert "default network" in problem
    props["network"] = "projects/host/global/networks/shared-vpc"
    assert check_cluster_network(CLUSTER, props) == []
