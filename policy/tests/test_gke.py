import pytest

from rules.gke import CLUSTER, NODE_POOL, check_cluster_workload_identity, check_node_identity

NODES_SA = "gemma-tpu-dev-nodes@my-project.iam.gserviceaccount.com"
COMPLIANT_NODE_CONFIG = {"serviceAccount": NODES_SA, "workloadMetadataConfig": {"mode": "GKE_METADATA"}}
AUTOPILOT = {"project": "my-project", "enableAutopilot": True,
             "clusterAutoscaling": {"autoProvisioningDefaults": {"serviceAccount": NODES_SA}}}


def test_node_pool_with_dedicated_sa_and_gke_metadata_passes(graph_entry):
    assert check_node_identity(NODE_POOL, graph_entry("tpu-slice-0")["inputs"]) == []


@pytest.mark.parametrize(
    "service_account", [None, "", "default", "123456789012-compute@developer.gserviceaccount.com"]
)
def test_node_pool_on_the_default_service_account_is_reported(graph_entry, service_account):
    props = graph_entry("tpu-slice-0")["inputs"]
    props["nodeConfig"]["serviceAccount"] = service_account
    [problem] = check_node_identity(NODE_POOL, props)
    assert "nodeConfig.serviceAccount" in problem


@pytest.mark.parametrize("metadata", [None, {"mode": "GCE_METADATA"}, {"mode": "MODE_UNSPECIFIED"}])
def test_node_pool_without_the_gke_metadata_server_is_reported(graph_entry, metadata):
    props = graph_entry("tpu-slice-0")["inputs"]
    props["nodeConfig"]["workloadMetadataConfig"] = metadata
    [problem] = check_node_identity(NODE_POOL, props)
    assert "GKE_METADATA" in problem


def test_cluster_that_removes_its_default_pool_is_not_judged_by_it(graph_entry):
    assert check_node_identity(CLUSTER, graph_entry("cluster")["inputs"]) == []


def test_cluster_that_keeps_a_default_pool_on_the_default_sa_is_reported(graph_entry):
    props = graph_entry("cluster")["inputs"]
    props["removeDefaultNodePool"] = False
    assert len(check_node_identity(CLUSTER, props)) == 2
    props["nodeConfig"] = COMPLIANT_NODE_CONFIG
    assert check_node_identity(CLUSTER, props) == []


def test_inline_node_pools_are_checked(graph_entry):
    props = graph_entry("cluster")["inputs"]
    props["nodePools"] = [{"name": "ok", "nodeConfig": COMPLIANT_NODE_CONFIG}, {"name": "bad", "nodeConfig": {}}]
    problems = check_node_identity(CLUSTER, props)
    assert len(problems) == 2 and all("nodePools[1]" in p for p in problems)


def test_autopilot_nodes_need_a_dedicated_service_account():
    assert check_node_identity(CLUSTER, AUTOPILOT) == []
    [problem] = check_node_identity(CLUSTER, {"project": "my-project", "enableAutopilot": True})
    assert "autoProvisioningDefaults.serviceAccount" in problem


def test_node_auto_provisioning_on_a_standard_cluster_needs_a_dedicated_sa(graph_entry):
    props = graph_entry("cluster")["inputs"]
    props["clusterAutoscaling"] = {"enabled": True, "autoProvisioningDefaults": {"serviceAccount": "default"}}
    [problem] = check_node_identity(CLUSTER, props)
    assert "autoProvisioningDefaults.serviceAccount" in problem


def test_cluster_with_workload_identity_passes(graph_entry):
    assert check_cluster_workload_identity(CLUSTER, graph_entry("cluster")["inputs"]) == []


def test_autopilot_always_has_workload_identity():
    assert check_cluster_workload_identity(CLUSTER, AUTOPILOT) == []


def test_cluster_without_workload_identity_is_reported(graph_entry):
    props = graph_entry("cluster")["inputs"]
    del props["workloadIdentityConfig"]
    [problem] = check_cluster_workload_identity(CLUSTER, props)
    assert "workloadIdentityConfig.workloadPool: my-project.svc.id.goog" in problem


def test_cluster_with_another_projects_workload_pool_is_reported(graph_entry):
    props = graph_entry("cluster")["inputs"]
    props["workloadIdentityConfig"] = {"workloadPool": "other-project.svc.id.goog"}
    [problem] = check_cluster_workload_identity(CLUSTER, props)
    assert "'my-project.svc.id.goog'" in problem
