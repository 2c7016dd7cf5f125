"""Each shipped stack's resource graph under Pulumi mocks: what `pulumi up` would create."""

import json
from collections import Counter

import pytest

from infra.config.stack_files import shipped_stacks
from infra.queueing.jobset import JOBSET_VERSION
from infra.pricing import PRICE_PER_CHIP_HOUR_USD
from infra.preview import PLACEHOLDER_DNS_ENDPOINT, PLACEHOLDER_PROJECT_NUMBER, preview
from tests.infra.conftest import PROJECT_ID, SHIPPED_STACKS, STANDARD_STACKS, of_type, one, previewed, stack_values
from tests.infra.test_serving import SERVING_RESOURCES, serving_accounts, serving_grants

CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
BUCKET = "gcp:storage/bucket:Bucket"
SERVICE = "gcp:projects/service:Service"
CPU_POOL = "cpu"


def tpu_pools(stack: str):
    return [r for r in of_type(previewed(stack).resources, NODE_POOL) if r.parent == "tpu"]


def nodes_email(stack: str) -> str:
    return f"gemma-{stack}-nodes@{PROJECT_ID}.iam.gserviceaccount.com"


def training_email(stack: str) -> str:
    return f"gemma-{stack}-train@{PROJECT_ID}.iam.gserviceaccount.com"


def preparation_email(stack: str) -> str:
    return f"gemma-{stack}-prep@{PROJECT_ID}.iam.gserviceaccount.com"


def test_the_shipped_stacks_are_these():
    assert set(shipped_stacks()) == set(SHIPPED_STACKS)


COMMON = {
    "pulumi:providers:gcp": 1,
    "pulumi:providers:kubernetes": 1,
    "gemma-tpu:infra:ProjectApis": 1,
    "gemma-tpu:infra:StackNetwork": 1,
    "gcp:compute/network:Network": 1,  # the stack's own VPC, its subnet, and egress for private nodes
    "gcp:compute/subnetwork:Subnetwork": 1,
    "gcp:compute/router:Router": 1,
    "gcp:compute/routerNat:RouterNat": 1,
    "gemma-tpu:infra:GkeCluster": 1,
    "gemma-tpu:infra:TpuPools": 1,
    "gemma-tpu:infra:Buckets": 1,
    "gemma-tpu:infra:TrainingIdentity": 1,
    "gemma-tpu:infra:Registry": 1,
    "gemma-tpu:infra:JobSetController": 1,
    "gemma-tpu:infra:TrainerImage": 1,
    "gemma-tpu:workloads:TrainingRun": 1,
    SERVICE: 10,
    "gcp:serviceaccount/account:Account": 3,  # nodes, training, data preparation
    "gcp:projects/iAMMember:IAMMember": 1,  # the node account's roles/container.defaultNodeServiceAccount
    CLUSTER: 1,
    BUCKET: 2,
    "gcp:storage/bucketIAMMember:BucketIAMMember": 3,
    "gcp:serviceaccount/iAMMember:IAMMember": 2,  # Workload Identity of training and data preparation
    "gcp:artifactregistry/repository:Repository": 1,
    "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember": 1,
    "kubernetes:core/v1:Namespace": 1,
    "kubernetes:core/v1:ServiceAccount": 2,  # training, data preparation
    "kubernetes:yaml/v2:ConfigFile": 1,  # JobSet
    "docker-build:index:Image": 1,  # the trainer image
    "gemma-tpu:infra:Monitoring": 1,
    # loss, tokens/s, step time, goodput and its 9 badput categories (trainer.contract), the training object's events
    "gcp:logging/metric:Metric": 14,
    "gcp:monitoring/dashboard:Dashboard": 1,
    "gcp:monitoring/alertPolicy:AlertPolicy": 4,  # failed, restarts, low utilization, idle TPU nodes
}
NODE_POOLS = {"dev": 2, "multihost": 2, "multislice": 3, "autopilot": 0, "queued": 3, "serving": 3}  # CPU pool + one per slice (+ serving's)
JOB, JOBSET = "kubernetes:batch/v1:Job", "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet"
# Data preparation is a Job; training a Job on one host, a JobSet on several.
RUN_OBJECTS = {
    "dev": {JOB: 2}, "multihost": {JOB: 1, JOBSET: 1}, "autopilot": {JOB: 2},
    # GKE's multi-tier checkpointing: its backup bucket, the node replicator's role on it, the CheckpointConfiguration.
    "multislice": {JOB: 1, JOBSET: 1, "gemma-tpu:infra:MultiTierCheckpointing": 1, BUCKET: 3,
                   "gcp:storage/bucketIAMMember:BucketIAMMember": 4, "kubernetes:checkpointing.gke.io/v1:CheckpointConfiguration": 1},
    # Three runs of two datasets behind Kueue (its release and the group of the stack's queue objects).
    "queued": {JOB: 2, JOBSET: 3, "gemma-tpu:workloads:TrainingRun": 3, "gemma-tpu:workloads:DataPreparation": 2,
               "gemma-tpu:infra:KueueQueue": 1, "kubernetes:yaml/v2:ConfigFile": 2, "kubernetes:yaml/v2:ConfigGroup": 1},
    "serving": {**SERVING_RESOURCES, JOB: 3},  # and the smoke Job
}  # fmt: skip


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_resource_counts(stack):
    expected = {**COMMON, **RUN_OBJECTS[stack], **({NODE_POOL: NODE_POOLS[stack]} if NODE_POOLS[stack] else {})}
    assert Counter(r.type for r in previewed(stack).resources) == expected


# The shapes the issue asks for: pools as (machine type, max nodes, placement).
EXPECTED_TPU_POOLS = {
    "dev": [("ct6e-standard-1t", 1, None)],
    "multihost": [("ct6e-standard-4t", 2, {"type": "COMPACT", "tpuTopology": "2x4"})],
    "multislice": [("ct6e-standard-4t", 2, {"type": "COMPACT", "tpuTopology": "2x4"})] * 2,
    "autopilot": [],
    "queued": [("ct6e-standard-4t", 2, {"type": "COMPACT", "tpuTopology": "2x4"})] * 2,
    "serving": [("ct6e-standard-4t", 1, None)],  # training's; the serving pool: tests/infra/test_serving.py
}


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_tpu_pools_have_the_slice_shape(stack):
    pools = tpu_pools(stack)
    shapes = [
        (p.inputs["nodeConfig"]["machineType"], p.inputs["autoscaling"]["totalMaxNodeCount"], p.inputs.get("placementPolicy"))
        for p in pools
    ]
    assert shapes == EXPECTED_TPU_POOLS[stack]
    assert [p.inputs["name"] for p in pools] == [f"tpu-slice-{i}" for i in range(len(pools))]
    for pool in pools:
        # zero hosts between runs: a finished run stops billing
        assert (pool.inputs["initialNodeCount"], pool.inputs["autoscaling"]["totalMinNodeCount"]) == (0, 0)
        assert pool.inputs["nodeLocations"] == ["us-east5-b"]
        assert pool.inputs["nodeConfig"]["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
        assert pool.inputs["nodeConfig"]["serviceAccount"] == nodes_email(stack)
        if stack != "queued":  # flex-start: tests/infra/queueing/test_queue.py
            assert not {"spot", "flexStart", "reservationAffinity"} & set(pool.inputs["nodeConfig"])  # on-demand


@pytest.mark.parametrize("stack", STANDARD_STACKS)
def test_every_node_pool_streams_the_trainer_image_from_the_stacks_registry(stack):
    """GKE image streaming (cloud.google.com/kubernetes-engine/docs/how-to/image-streaming): the node
    pool's gcfsConfig on a COS containerd image, the Container File System API enabled, and the
    image in Artifact Registry: a new TPU host starts the trainer before its image is all there."""
    resources = previewed(stack).resources
    for pool in of_type(resources, NODE_POOL):
        assert pool.inputs["nodeConfig"]["gcfsConfig"] == {"enabled": True}, pool.name
        assert pool.inputs["nodeConfig"]["imageType"] == "COS_CONTAINERD", pool.name
    assert "containerfilesystem.googleapis.com" in {s.inputs["service"] for s in of_type(resources, SERVICE)}
    assert previewed(stack).outputs["registryUrl"].startswith("us-east5-docker.pkg.dev/")


@pytest.mark.parametrize("stack", STANDARD_STACKS)
def test_standard_cluster(stack):
    resources = previewed(stack).resources
    cluster = one(resources, CLUSTER).inputs
    assert (cluster["name"], cluster["location"]) == (f"gemma-{stack}", "us-east5-b")
    assert cluster["workloadIdentityConfig"] == {"workloadPool": f"{PROJECT_ID}.svc.id.goog"}
    assert cluster["addonsConfig"]["gcsFuseCsiDriverConfig"] == {"enabled": True}
    assert cluster["releaseChannel"] == {"channel": "REGULAR"}
    assert cluster["removeDefaultNodePool"] is True
    assert cluster["deletionProtection"] is False  # so `pulumi destroy` works on the shipped stacks
    assert cluster["nodeConfig"]["serviceAccount"] == nodes_email(stack)  # never the default Compute account
    cpu = one(resources, NODE_POOL, CPU_POOL).inputs
    assert cpu["nodeConfig"]["machineType"].startswith("e2-")
    assert cpu["nodeConfig"]["serviceAccount"] == nodes_email(stack)
    assert cpu["nodeConfig"]["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
    assert cpu["autoscaling"]["minNodeCount"] >= 1  # controllers always have a home


@pytest.mark.parametrize("stack", STANDARD_STACKS)
def test_multi_tier_checkpointing_is_the_addon_its_bucket_and_the_pools_configuration_where_a_stack_turns_it_on(stack):
    resources = previewed(stack).resources
    addon = one(resources, CLUSTER).inputs["addonsConfig"].get("highScaleCheckpointingConfig")
    configurations = of_type(resources, "kubernetes:checkpointing.gke.io/v1:CheckpointConfiguration")
    if stack not in MULTI_TIER_STACKS:
        assert addon is None and configurations == []
        return
    assert addon == {"enabled": True}
    bucket = one(resources, BUCKET, "multi-tier-bucket").inputs
    assert bucket["hierarchicalNamespace"] == {"enabled": True}  # the replicator needs atomic folder renames
    (configuration,) = configurations
    assert configuration.inputs["spec"]["cloudStorageBucketName"] == bucket["name"]
    # Applied once the cluster (whose addon brings the CRD) is there.
    assert f"gemma-{stack}" in configuration.depends_on and "replicator-backup-access" in configuration.depends_on


def test_autopilot_cluster():
    resources = previewed("autopilot").resources
    cluster = one(resources, CLUSTER).inputs
    assert cluster["enableAutopilot"] is True
    assert cluster["location"] == "us-east5"  # regional
    assert cluster["clusterAutoscaling"]["autoProvisioningDefaults"]["serviceAccount"] == nodes_email("autopilot")
    assert cluster["deletionProtection"] is False
    assert of_type(resources, NODE_POOL) == []


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_buckets_are_private(stack):
    buckets = {b.inputs["name"]: b.inputs for b in of_type(previewed(stack).resources, BUCKET)}
    assert set(buckets) == {f"{PROJECT_ID}-{stack}-data", f"{PROJECT_ID}-{stack}-artifacts",
                            *([f"{PROJECT_ID}-{stack}-mtc"] if stack in MULTI_TIER_STACKS else [])}
    for bucket in buckets.values():
        assert bucket["uniformBucketLevelAccess"] is True
        assert bucket["publicAccessPrevention"] == "enforced"
        assert bucket["hierarchicalNamespace"] == {"enabled": True}
        assert bucket["location"] == "US-EAST5"


def iam_grants(stack: str) -> set[tuple[str, str, str]]:
    """(on what, role, member) for every IAM grant in the stack."""
    grants = set()
    for r in previewed(stack).resources:
        if "iAMMember" in r.type or "IamMember" in r.type or "IAMMember" in r.type:
            target = r.inputs.get("bucket") or r.inputs.get("repository") or r.inputs.get("serviceAccountId") or f"project {r.inputs['project']}"
            grants.add((target, r.inputs["role"], r.inputs["member"]))
    return grants


MULTI_TIER_STACKS = ("multislice",)


def multi_tier_grants(stack: str) -> set[tuple[str, str, str]]:
    """GKE's multi-tier checkpointing: its node replicator's Kubernetes account writes the backup bucket."""
    if stack not in MULTI_TIER_STACKS:
        return set()
    replicator = (f"principal://iam.googleapis.com/projects/{PLACEHOLDER_PROJECT_NUMBER}/locations/global/workloadIdentityPools/"
                  f"{PROJECT_ID}.svc.id.goog/subject/ns/gke-managed-checkpointing/sa/gke-checkpointing-multitier-node")
    return {(f"{PROJECT_ID}-{stack}-mtc", "roles/storage.objectUser", replicator)}


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_iam_grants_are_exactly_these(stack):
    nodes, training = f"serviceAccount:{nodes_email(stack)}", f"serviceAccount:{training_email(stack)}"
    preparation = f"serviceAccount:{preparation_email(stack)}"
    project = f"project {PROJECT_ID}"
    assert iam_grants(stack) == serving_grants(stack) | multi_tier_grants(stack) | {
        (project, "roles/container.defaultNodeServiceAccount", nodes),
        (f"gemma-{stack}", "roles/artifactregistry.reader", nodes),
        (f"{PROJECT_ID}-{stack}-data", "roles/storage.objectViewer", training),
        (f"{PROJECT_ID}-{stack}-artifacts", "roles/storage.objectUser", training),
        (f"{PROJECT_ID}-{stack}-data", "roles/storage.objectUser", preparation),
        (
            f"projects/{PROJECT_ID}/serviceAccounts/{training_email(stack)}",
            "roles/iam.workloadIdentityUser",
            f"serviceAccount:{PROJECT_ID}.svc.id.goog[training/trainer]",
        ),
        (
            f"projects/{PROJECT_ID}/serviceAccounts/{preparation_email(stack)}",
            "roles/iam.workloadIdentityUser",
            f"serviceAccount:{PROJECT_ID}.svc.id.goog[training/trainer-prep]",
        ),
    }


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_no_project_wide_storage_or_primitive_role(stack):
    for target, role, member in iam_grants(stack):
        assert role not in ("roles/owner", "roles/editor", "roles/viewer"), (target, role, member)
        if target.startswith("project "):
            assert not role.startswith("roles/storage."), (role, member)
            assert training_email(stack) not in member and preparation_email(stack) not in member, role


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_each_kubernetes_service_account_is_bound_to_its_own_google_account(stack):
    resources = previewed(stack).resources
    accounts = {
        (r.inputs["metadata"]["namespace"], r.inputs["metadata"]["name"]): r.inputs["metadata"]["annotations"]
        for r in of_type(resources, "kubernetes:core/v1:ServiceAccount")
    }
    assert accounts == serving_accounts(stack) | {
        ("training", "trainer"): {"iam.gke.io/gcp-service-account": training_email(stack)},
        ("training", "trainer-prep"): {"iam.gke.io/gcp-service-account": preparation_email(stack)},
    }
    assert one(resources, "kubernetes:core/v1:Namespace").inputs["metadata"]["name"] == "training"


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_kubernetes_object_goes_through_the_cluster_provider(stack):
    resources = previewed(stack).resources
    kubernetes = [r for r in resources if r.type.startswith("kubernetes:")]
    assert kubernetes and all(r.provider == "gke" for r in kubernetes), [(r.name, r.provider) for r in kubernetes]
    provider = one(resources, "pulumi:providers:kubernetes", "gke")
    assert provider.inputs["clusterIdentifier"] == f"gemma-{stack}-id"  # the cluster's ID
    assert provider.inputs["enableServerSideApply"] == "true"
    kubeconfig = json.loads(provider.inputs["kubeconfig"])
    # The cluster's DNS endpoint, whose certificate is publicly trusted: no CA data to go stale.
    assert kubeconfig["clusters"][0]["cluster"] == {"server": f"https://{PLACEHOLDER_DNS_ENDPOINT}"}
    assert kubeconfig["users"][0]["user"]["exec"]["command"] == "gke-gcloud-auth-plugin"


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_jobset_is_pinned_and_installed_after_the_cluster_and_cpu_pool(stack):
    install = one(previewed(stack).resources, "kubernetes:yaml/v2:ConfigFile", "jobset")
    assert install.inputs["file"] == (
        f"https://github.com/kubernetes-sigs/jobset/releases/download/{JOBSET_VERSION}/manifests.yaml"
    )
    assert JOBSET_VERSION == "v0.12.0"
    assert install.provider == "gke"
    needs = {f"gemma-{stack}"} | ({CPU_POOL} if stack in STANDARD_STACKS else set())
    assert needs <= set(install.depends_on)


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_apis_are_enabled_first_and_kept_on_destroy(stack):
    resources = previewed(stack).resources
    services = of_type(resources, SERVICE)
    assert {s.inputs["service"] for s in services} >= {"container.googleapis.com", "storage.googleapis.com", "artifactregistry.googleapis.com"}
    assert all(s.inputs["disableOnDestroy"] is False for s in services)
    api_names = {s.name for s in services}
    for r in resources:
        if r.type.startswith("gcp:") and r.type != SERVICE:
            assert api_names <= set(r.depends_on), r.name
            assert r.provider == "gcp", r.name


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_registry_has_a_cleanup_policy(stack):
    repository = one(previewed(stack).resources, "gcp:artifactregistry/repository:Repository", "trainer-images").inputs
    assert (repository["format"], repository["location"], repository["repositoryId"]) == ("DOCKER", "us-east5", f"gemma-{stack}")
    assert repository["cleanupPolicyDryRun"] is False
    actions = {policy["action"] for policy in repository["cleanupPolicies"]}
    assert actions == {"KEEP", "DELETE"}


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_outputs(stack):
    outputs = previewed(stack).outputs
    location = "us-east5" if stack == "autopilot" else "us-east5-b"
    assert outputs["clusterName"] == f"gemma-{stack}"
    assert outputs["clusterLocation"] == location
    assert outputs["getCredentials"] == (
        f"gcloud container clusters get-credentials gemma-{stack} --location {location} --project {PROJECT_ID} --dns-endpoint"
    )
    assert outputs["dataBucketUrl"] == f"gs://{PROJECT_ID}-{stack}-data"
    assert outputs["artifactsBucketUrl"] == f"gs://{PROJECT_ID}-{stack}-artifacts"
    assert outputs["registryUrl"] == f"us-east5-docker.pkg.dev/{PROJECT_ID}/gemma-{stack}"
    assert (outputs["namespace"], outputs["kubernetesServiceAccount"]) == ("training", "trainer")
    assert outputs["trainingServiceAccount"] == training_email(stack)
    assert outputs["preparationServiceAccount"] == preparation_email(stack)


CHIPS = {"dev": 1, "multihost": 8, "multislice": 16, "autopilot": 1, "queued": 16, "serving": 4}  # training's TPUs


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_cost_per_hour_is_chips_times_the_price(stack):
    cost = previewed(stack).outputs["tpuCostPerHourUsd"]
    price = PRICE_PER_CHIP_HOUR_USD["v6e"]
    assert cost["chips"] == CHIPS[stack]
    assert cost["onDemand"] == pytest.approx(CHIPS[stack] * price.on_demand)
    assert cost["source"] == "https://cloud.google.com/tpu/pricing, us-east5, on-demand, read from memory of the 2025 page, not re-read since"
    assert cost["spot"].startswith("not estimated") and "https://cloud.google.com/spot-vms/pricing" in cost["spot"]


def capacity_pool(capacity: dict) -> dict:
    values = stack_values("multihost", **{"gemma-tpu:tpu": {"topology": "2x4", **capacity}})
    [pool] = [r for r in preview(values, "capacity").resources if r.type == NODE_POOL and r.parent == "tpu"]
    return pool.inputs


def test_spot_pool():
    pool = capacity_pool({"capacity": "spot"})
    assert pool["nodeConfig"]["spot"] is True
    assert pool["autoscaling"]["totalMinNodeCount"] == 0


def test_reservation_pool():
    pool = capacity_pool({"capacity": "reservation", "reservation": "team-v6e"})
    assert pool["nodeConfig"]["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["team-v6e"],
    }


def test_flex_start_pool():
    pool = capacity_pool({"capacity": "flex-start"})
    assert pool["nodeConfig"]["flexStart"] is True
    assert pool["nodeConfig"]["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
    assert pool["management"]["autoRepair"] is False
    assert (pool["autoscaling"]["totalMinNodeCount"], pool["autoscaling"]["locationPolicy"]) == (0, "ANY")
