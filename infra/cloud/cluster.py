"""The GKE cluster (Standard or Autopilot), its node service account, the CPU pool and the
Kubernetes provider that every Kubernetes object of the stack goes through.

Hardened defaults: private nodes on the stack's network (infra.cloud.network), a control plane whose IP
endpoint admits only `gemma-tpu:cluster.authorizedNetworks` and whose DNS endpoint admits only
callers with IAM permission on the cluster (how `pulumi up` and kubectl reach it from anywhere),
the REGULAR release channel with a weekly maintenance window, Dataplane V2 and shielded nodes
(always on in Autopilot), and GKE deletion protection with `gemma-tpu:protect`.
"""

import datetime
import json
from collections.abc import Sequence

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra.catalog.names import CPU_POOL_NAME
from infra.cloud.component import Component, service_account_member
from infra.cloud.network import StackNetwork
from infra.config import StackConfig
from infra.config.cluster import CPU_POOL_NODES

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
RELEASE_CHANNEL = "REGULAR"
# Least privilege for nodes: GKE's own role for node service accounts (logs, metrics, resource
# metadata, autoscaler metrics; CIS GKE Benchmark 2.0 5.2.1, and terraform-google-kubernetes-engine
# v29 replaced the four hand-picked roles with it). Image pulls are granted on the one repository
# (infra.cloud.registry).
NODE_ROLES = ("roles/container.defaultNodeServiceAccount",)
# The CPU pool (infra.catalog.names.CPU_POOL_NAME): controllers (JobSet) and data preparation, never on TPU hosts.
CPU_MACHINE_TYPE = "e2-standard-4"
# The first occurrence the weekly maintenance window recurs from: any past Monday.
_MAINTENANCE_ANCHOR = "2025-01-06"
_RFC3339 = "%Y-%m-%dT%H:%M:%SZ"


# Image streaming (GKE's Container File System: cloud.google.com/kubernetes-engine/docs/how-to/image-streaming):
# a new node starts the trainer's container while its multi-GB image is still arriving, instead
# of after a full pull. It needs the Container File System API (infra.cloud.apis), a COS containerd node
# image and an image in Artifact Registry (the stack's registry; another registry's image is
# pulled as before). Autopilot has it on by default.
NODE_IMAGE = "COS_CONTAINERD"


def image_streaming() -> gcp.container.NodePoolNodeConfigGcfsConfigArgs:
    return gcp.container.NodePoolNodeConfigGcfsConfigArgs(enabled=True)


def gke_metadata() -> gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs:
    """Pods get the GKE metadata server, so they act as their Kubernetes ServiceAccount's Google
    account (Workload Identity) and never as the node's."""
    return gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs(mode="GKE_METADATA")


class GkeCluster(Component):
    """The cluster and what makes it usable: `cluster`, `node_service_account`, `cpu_pool`
    (None on Autopilot), `provider` (Kubernetes) and `ready` (what Kubernetes objects wait for)."""

    def __init__(self, name: str, config: StackConfig, network: StackNetwork, *, after: Sequence[pulumi.Resource] = (), opts=None):
        super().__init__("GkeCluster", name, after=after, opts=opts)
        self._network = network
        self.node_service_account = gcp.serviceaccount.Account(
            "gke-nodes",
            gcp.serviceaccount.AccountArgs(
                account_id=config.node_service_account_id,
                display_name=f"GKE nodes of {config.cluster_name}",
            ),
            opts=self.child(),
        )
        node_member = service_account_member(self.node_service_account)
        self.node_roles = [
            gcp.projects.IAMMember(
                f"gke-nodes-{role.removeprefix('roles/').replace('.', '-')}",
                gcp.projects.IAMMemberArgs(project=config.project, role=role, member=node_member),
                opts=self.child(),
            )
            for role in NODE_ROLES
        ]
        if config.cluster_mode == "autopilot":
            self.cluster = self._autopilot(config)
            self.cpu_pool = None
        else:
            self.cluster = self._standard(config)
            self.cpu_pool = self._cpu_pool(config)
        self.ready: list[pulumi.Resource] = [self.cluster, *([self.cpu_pool] if self.cpu_pool else [])]
        self.provider = k8s.Provider(
            "gke",
            k8s.ProviderArgs(
                kubeconfig=pulumi.Output.all(self.cluster.name, self.dns_endpoint).apply(lambda args: kubeconfig(*args)),
                # Only a new cluster replaces the provider (and so every Kubernetes object); a
                # refreshed kubeconfig is an update (pulumi-kubernetes#4019).
                cluster_identifier=self.cluster.id,
                enable_server_side_apply=True,
                # Once the cluster is gone (deleted outside Pulumi, or a destroy that stopped half
                # way), its Kubernetes objects are dropped from the state instead of failing destroy.
                delete_unreachable=True,
            ),
            opts=self.child(),
        )
        self.register_outputs({"clusterName": self.cluster.name, "dnsEndpoint": self.dns_endpoint})

    @property
    def dns_endpoint(self) -> pulumi.Output[str]:
        """The control plane's DNS name: reachable from anywhere, admitting IAM-authorized callers only."""
        return self.cluster.control_plane_endpoints_config.apply(lambda endpoints: endpoints.dns_endpoint_config.endpoint)

    def _common(self, config: StackConfig) -> dict:
        """Cluster arguments both modes share: network, private nodes, control-plane access, maintenance."""
        access = config.access
        start = datetime.datetime.fromisoformat(f"{_MAINTENANCE_ANCHOR}T{access.maintenance_start_utc}:00+00:00")
        end = start + datetime.timedelta(hours=access.maintenance_hours)
        return dict(
            name=config.cluster_name,
            location=config.cluster_location,
            network=self._network.network,
            subnetwork=self._network.subnetwork,
            ip_allocation_policy=gcp.container.ClusterIpAllocationPolicyArgs(
                cluster_secondary_range_name=config.network.pod_range_name,
                services_secondary_range_name=config.network.service_range_name,
            ),
            private_cluster_config=gcp.container.ClusterPrivateClusterConfigArgs(enable_private_nodes=True),
            master_authorized_networks_config=gcp.container.ClusterMasterAuthorizedNetworksConfigArgs(
                cidr_blocks=[gcp.container.ClusterMasterAuthorizedNetworksConfigCidrBlockArgs(cidr_block=cidr, display_name=cidr)
                             for cidr in access.authorized_networks],
                gcp_public_cidrs_access_enabled=False,
            ),
            control_plane_endpoints_config=gcp.container.ClusterControlPlaneEndpointsConfigArgs(
                dns_endpoint_config=gcp.container.ClusterControlPlaneEndpointsConfigDnsEndpointConfigArgs(allow_external_traffic=True),
            ),
            release_channel=gcp.container.ClusterReleaseChannelArgs(channel=RELEASE_CHANNEL),
            # gemma-tpu:cluster.version: a floor within the channel (checked in config for what needs it).
            min_master_version=config.cluster_version,
            maintenance_policy=gcp.container.ClusterMaintenancePolicyArgs(
                recurring_window=gcp.container.ClusterMaintenancePolicyRecurringWindowArgs(
                    start_time=start.strftime(_RFC3339), end_time=end.strftime(_RFC3339),
                    recurrence="FREQ=WEEKLY;BYDAY=" + ",".join(access.maintenance_days),
                ),
            ),
            deletion_protection=config.protect,
        )

    def _standard(self, config: StackConfig) -> gcp.container.Cluster:
        return gcp.container.Cluster(
            config.cluster_name,
            gcp.container.ClusterArgs(
                **self._common(config),
                # The default pool is replaced by the CPU and TPU pools; even while it exists it
                # runs as the node account, never the project-Editor default Compute Engine one.
                remove_default_node_pool=True,
                initial_node_count=1,
                node_config=gcp.container.ClusterNodeConfigArgs(
                    service_account=self.node_service_account.email,
                    oauth_scopes=[CLOUD_PLATFORM_SCOPE],
                    workload_metadata_config=gcp.container.ClusterNodeConfigWorkloadMetadataConfigArgs(
                        mode="GKE_METADATA"
                    ),
                ),
                workload_identity_config=gcp.container.ClusterWorkloadIdentityConfigArgs(
                    workload_pool=config.workload_identity_pool
                ),
                addons_config=gcp.container.ClusterAddonsConfigArgs(
                    gcs_fuse_csi_driver_config=gcp.container.ClusterAddonsConfigGcsFuseCsiDriverConfigArgs(
                        enabled=True
                    ),
                    # GKE's multi-tier checkpointing (infra.cloud.multi_tier): its CRD, controller and CSI driver.
                    high_scale_checkpointing_config=gcp.container.ClusterAddonsConfigHighScaleCheckpointingConfigArgs(
                        enabled=True
                    ) if config.multi_tier else None,
                ),
                datapath_provider="ADVANCED_DATAPATH",  # Dataplane V2: eBPF networking, network policy enforced
                enable_shielded_nodes=True,
                # Serving's PodMonitoring (and its autoscaler's metric) needs Managed Service for Prometheus'
                # managed collection: GKE's default for new clusters of recent versions only, so set here
                # (Autopilot has it always).
                monitoring_config=gcp.container.ClusterMonitoringConfigArgs(
                    managed_prometheus=gcp.container.ClusterMonitoringConfigManagedPrometheusArgs(enabled=True)
                ) if config.serving else None,
            ),
            # After the default pool is gone GKE reports another node config; without this a
            # later `pulumi up` would see a diff there and replace the cluster.
            opts=self.child(*self.node_roles, *self._network.ready, protect=config.protect,
                            ignore_changes=["nodeConfig", "initialNodeCount"]),  # fmt: skip
        )

    def _autopilot(self, config: StackConfig) -> gcp.container.Cluster:
        # Workload Identity, the GCS FUSE CSI driver, Dataplane V2 and shielded nodes are always on in Autopilot.
        return gcp.container.Cluster(
            config.cluster_name,
            gcp.container.ClusterArgs(
                **self._common(config),
                enable_autopilot=True,
                cluster_autoscaling=gcp.container.ClusterClusterAutoscalingArgs(
                    auto_provisioning_defaults=gcp.container.ClusterClusterAutoscalingAutoProvisioningDefaultsArgs(
                        service_account=self.node_service_account.email,
                        oauth_scopes=[CLOUD_PLATFORM_SCOPE],
                    ),
                ),
            ),
            opts=self.child(*self.node_roles, *self._network.ready, protect=config.protect),
        )

    def _cpu_pool(self, config: StackConfig) -> gcp.container.NodePool:
        min_nodes, max_nodes = CPU_POOL_NODES
        return gcp.container.NodePool(
            CPU_POOL_NAME,
            gcp.container.NodePoolArgs(
                name=CPU_POOL_NAME,
                cluster=self.cluster.name,
                location=config.cluster_location,  # a node pool lives where its cluster does
                initial_node_count=min_nodes,
                autoscaling=gcp.container.NodePoolAutoscalingArgs(min_node_count=min_nodes, max_node_count=max_nodes),
                management=gcp.container.NodePoolManagementArgs(auto_repair=True, auto_upgrade=True),
                node_config=gcp.container.NodePoolNodeConfigArgs(
                    machine_type=CPU_MACHINE_TYPE,
                    image_type=NODE_IMAGE,
                    gcfs_config=image_streaming(),  # data preparation runs the trainer's image too
                    service_account=self.node_service_account.email,
                    oauth_scopes=[CLOUD_PLATFORM_SCOPE],
                    workload_metadata_config=gke_metadata(),
                    shielded_instance_config=gcp.container.NodePoolNodeConfigShieldedInstanceConfigArgs(
                        enable_secure_boot=True, enable_integrity_monitoring=True
                    ),
                ),
            ),
            opts=self.child(),
        )


def kubeconfig(cluster_name: str, dns_endpoint: str) -> str:
    """A kubeconfig for the cluster's DNS endpoint (its certificate is publicly trusted, so no CA
    data) that authenticates with `gke-gcloud-auth-plugin` (the user's gcloud login)."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": cluster_name, "cluster": {"server": f"https://{dns_endpoint}"}}
            ],
            "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": cluster_name}}],
            "current-context": cluster_name,
            "users": [
                {
                    "name": cluster_name,
                    "user": {
                        "exec": {
                            "apiVersion": "client.authentication.k8s.io/v1beta1",
                            "command": "gke-gcloud-auth-plugin",
                            "installHint": "Install gke-gcloud-auth-plugin: gcloud components install gke-gcloud-auth-plugin",
                            "provideClusterInfo": True,
                        }
                    },
                }
            ],
        }
    )
