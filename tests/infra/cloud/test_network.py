"""The network and the cluster's hardened defaults, read from each shipped stack's preview: private
nodes on the stack's own VPC with egress through Cloud NAT, a control plane reached through its
IAM-gated DNS endpoint and, by IP, only from the ranges a user lists, a weekly maintenance window,
Dataplane V2 and shielded nodes; or an existing network the stack only refers to."""

import pytest

from infra.preview import preview
from tests.infra.conftest import SHIPPED_STACKS, STANDARD_STACKS, of_type, one, previewed, stack_values
from tests.infra.cloud.test_destroy import CLUSTER, NODE_POOL, prerequisites

NETWORK_TYPES = ("gcp:compute/network:Network", "gcp:compute/subnetwork:Subnetwork", "gcp:compute/router:Router",
                 "gcp:compute/routerNat:RouterNat")  # fmt: skip


def _cluster(resources):
    return one(resources, CLUSTER).inputs


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_nodes_are_private_on_the_stacks_own_network_with_nat_for_egress(stack):
    resources = previewed(stack).resources
    network = one(resources, "gcp:compute/network:Network").inputs
    subnetwork = one(resources, "gcp:compute/subnetwork:Subnetwork").inputs
    nat = one(resources, "gcp:compute/routerNat:RouterNat").inputs
    assert network["autoCreateSubnetworks"] is False and network["name"] == f"gemma-{stack}"
    assert subnetwork["ipCidrRange"] == "10.0.0.0/20" and subnetwork["privateIpGoogleAccess"] is True
    assert {r["rangeName"]: r["ipCidrRange"] for r in subnetwork["secondaryIpRanges"]} == {
        "pods": "10.4.0.0/14", "services": "10.8.0.0/20"
    }
    assert nat["sourceSubnetworkIpRangesToNat"] == "ALL_SUBNETWORKS_ALL_IP_RANGES"
    cluster = _cluster(resources)
    assert (cluster["network"], cluster["subnetwork"]) == ("network-id", "subnetwork-id")
    assert cluster["privateClusterConfig"]["enablePrivateNodes"] is True
    assert cluster["ipAllocationPolicy"] == {"clusterSecondaryRangeName": "pods", "servicesSecondaryRangeName": "services"}


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_the_control_plane_admits_iam_callers_by_dns_and_no_ip_range_by_default(stack):
    cluster = _cluster(previewed(stack).resources)
    assert cluster["controlPlaneEndpointsConfig"]["dnsEndpointConfig"]["allowExternalTraffic"] is True
    authorized = cluster["masterAuthorizedNetworksConfig"]
    assert authorized.get("cidrBlocks", []) == [] and authorized["gcpPublicCidrsAccessEnabled"] is False


def test_authorized_networks_come_from_the_stack_config():
    values = stack_values("dev", **{"gemma-tpu:cluster": {"authorizedNetworks": ["203.0.113.0/24", "198.51.100.7/32"]}})
    authorized = _cluster(preview(values, "dev").resources)["masterAuthorizedNetworksConfig"]
    assert [block["cidrBlock"] for block in authorized["cidrBlocks"]] == ["203.0.113.0/24", "198.51.100.7/32"]


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_upgrades_wait_for_a_weekly_window_on_the_regular_channel(stack):
    cluster = _cluster(previewed(stack).resources)
    assert cluster["releaseChannel"]["channel"] == "REGULAR"
    window = cluster["maintenancePolicy"]["recurringWindow"]
    assert window["recurrence"] == "FREQ=WEEKLY;BYDAY=SA,SU"
    assert (window["startTime"], window["endTime"]) == ("2025-01-06T02:00:00Z", "2025-01-06T08:00:00Z")


def test_the_maintenance_window_comes_from_the_stack_config():
    values = stack_values("dev", **{"gemma-tpu:cluster": {"maintenanceDays": ["TU", "TH"], "maintenanceStartUtc": "22:30",
                                                          "maintenanceHours": 8}})  # fmt: skip
    window = _cluster(preview(values, "dev").resources)["maintenancePolicy"]["recurringWindow"]
    assert window == {"startTime": "2025-01-06T22:30:00Z", "endTime": "2025-01-07T06:30:00Z", "recurrence": "FREQ=WEEKLY;BYDAY=TU,TH"}


@pytest.mark.parametrize("stack", STANDARD_STACKS)
def test_standard_clusters_run_dataplane_v2_and_shielded_nodes_with_secure_boot_on_the_cpu_pool(stack):
    resources = previewed(stack).resources
    cluster = _cluster(resources)
    assert cluster["datapathProvider"] == "ADVANCED_DATAPATH" and cluster["enableShieldedNodes"] is True
    cpu = [p for p in of_type(resources, NODE_POOL) if p.inputs["name"] == "cpu"][0]
    assert cpu.inputs["nodeConfig"]["shieldedInstanceConfig"] == {"enableSecureBoot": True, "enableIntegrityMonitoring": True}


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_destroy_removes_the_cluster_before_its_network_router_and_nat(stack):
    resources = previewed(stack).resources
    waits_for = prerequisites(resources, one(resources, CLUSTER))
    for type_ in NETWORK_TYPES:
        assert (type_, one(resources, type_).name) in waits_for, type_


def test_an_existing_network_is_referred_to_and_nothing_is_created_in_it():
    values = stack_values("multihost", **{"gemma-tpu:network": {
        "name": "projects/host-project/global/networks/shared-vpc",
        "subnetwork": "projects/host-project/regions/us-east5/subnetworks/gke", "podRangeName": "gke-pods",
        "serviceRangeName": "gke-services"}})  # fmt: skip
    resources = preview(values, "multihost").resources
    assert not [r for r in resources if r.type in NETWORK_TYPES]
    cluster = _cluster(resources)
    assert cluster["network"] == "projects/host-project/global/networks/shared-vpc"
    assert cluster["subnetwork"] == "projects/host-project/regions/us-east5/subnetworks/gke"
    assert cluster["ipAllocationPolicy"] == {"clusterSecondaryRangeName": "gke-pods", "servicesSecondaryRangeName": "gke-services"}
    assert cluster["privateClusterConfig"]["enablePrivateNodes"] is True
