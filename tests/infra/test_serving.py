"""The serving stack under Pulumi mocks: the pool it scales from zero, an identity that can only read
the artifacts bucket, the image through the stack's registry, the objects in order, the outputs that
reach the server, and what `pulumi destroy` removes."""

import json
import subprocess
import sys

import pytest
import yaml

from infra.config.serving import SERVING_POOL, mirror_repository_id
from infra import preview as preview_module
from infra.preview import preview
from infra.config.stack_files import PROJECT_ROOT
from tests.infra.conftest import PROJECT_ID, of_type, one, previewed, stack_values
from tests.infra.cloud.test_destroy import prerequisites
from trainer.contract import USER_ERROR

NODE_POOL = "gcp:container/nodePool:NodePool"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
JOB = "kubernetes:batch/v1:Job"
BUCKET_ROLE = "gcp:storage/bucketIAMMember:BucketIAMMember"
REPOSITORY = "gcp:artifactregistry/repository:Repository"
SERVING_EMAIL = f"gemma-serving-serve@{PROJECT_ID}.iam.gserviceaccount.com"
# What the serving stack declares beyond a training stack (tests/infra/test_stacks.py counts the rest).
SERVING_RESOURCES = {
    "gemma-tpu:infra:ServingInfra": 1,
    "gemma-tpu:workloads:ServingDeployment": 1,
    "gcp:serviceaccount/account:Account": 4,  # nodes, training, data preparation, serving
    "gcp:storage/bucketIAMMember:BucketIAMMember": 4,
    "gcp:serviceaccount/iAMMember:IAMMember": 3,
    REPOSITORY: 2,  # the trainer's and the Docker Hub remote
    "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember": 2,
    "kubernetes:core/v1:ServiceAccount": 3,
    DEPLOYMENT: 1,
    "kubernetes:core/v1:Service": 1,
    "kubernetes:monitoring.googleapis.com/v1:PodMonitoring": 1,
}


def serving_grants(stack: str) -> set[tuple[str, str, str]]:
    """The IAM grants serving adds to `stack` (none to a stack without it): read the artifacts, act
    as the vllm ServiceAccount, let the nodes pull from the Docker Hub remote repository."""
    if stack != "serving":
        return set()
    return {
        (f"{PROJECT_ID}-serving-artifacts", "roles/storage.objectViewer", f"serviceAccount:{SERVING_EMAIL}"),
        (f"projects/{PROJECT_ID}/serviceAccounts/{SERVING_EMAIL}", "roles/iam.workloadIdentityUser",
         f"serviceAccount:{PROJECT_ID}.svc.id.goog[training/vllm]"),
        ("gemma-serving-dockerhub", "roles/artifactregistry.reader", f"serviceAccount:gemma-serving-nodes@{PROJECT_ID}.iam.gserviceaccount.com"),
    }  # fmt: skip


def serving_accounts(stack: str) -> dict[tuple[str, str], dict[str, str]]:
    """The Kubernetes ServiceAccounts serving adds to `stack`, with their Workload Identity annotation."""
    return {("training", "vllm"): {"iam.gke.io/gcp-service-account": SERVING_EMAIL}} if stack == "serving" else {}


def serving_preview(**serving_keys):
    values = stack_values("serving")
    values["gemma-tpu:serving"] = {**values["gemma-tpu:serving"], **serving_keys}
    return preview(values, "serving")


def pod_spec(resources) -> dict:
    return one(resources, DEPLOYMENT, "vllm").inputs["spec"]["template"]["spec"]


def test_the_serving_pool_is_the_catalogs_slice_and_scales_from_zero():
    pool = one(previewed("serving").resources, NODE_POOL, SERVING_POOL).inputs
    assert pool["nodeConfig"]["machineType"] == "ct6e-standard-1t" and pool["initialNodeCount"] == 0
    assert (pool["autoscaling"]["totalMinNodeCount"], pool["autoscaling"]["totalMaxNodeCount"]) == (0, 2)  # one replica, one rolling in
    assert "placementPolicy" not in pool  # one host a replica
    assert pool["nodeConfig"]["taints"] == [{"key": "gemma-tpu/serving", "value": "true", "effect": "NO_SCHEDULE"}]
    spec = pod_spec(previewed("serving").resources)
    assert spec["nodeSelector"]["cloud.google.com/gke-nodepool"] == SERVING_POOL
    assert {"key": "gemma-tpu/serving", "value": "true", "operator": "Equal", "effect": "NoSchedule"} in spec["tolerations"]


def test_the_pool_grows_to_the_autoscalers_bound_and_uses_spot_when_asked():
    resources = serving_preview(capacity="spot", autoscaling={"maxReplicas": 3, "queueDepth": 8}).resources
    pool = one(resources, NODE_POOL, SERVING_POOL).inputs
    assert pool["autoscaling"]["totalMaxNodeCount"] == 3 + 1 and pool["nodeConfig"]["spot"] is True
    assert one(resources, "kubernetes:autoscaling/v2:HorizontalPodAutoscaler", "vllm").inputs["spec"]["maxReplicas"] == 3


def test_the_serving_account_only_reads_the_artifacts_bucket():
    resources = previewed("serving").resources
    grants = [r.inputs for r in of_type(resources, BUCKET_ROLE) if r.inputs["member"] == f"serviceAccount:{SERVING_EMAIL}"]
    artifacts = one(resources, "gcp:storage/bucket:Bucket", "artifacts-bucket").inputs["name"]
    assert grants == [{"bucket": artifacts, "role": "roles/storage.objectViewer", "member": f"serviceAccount:{SERVING_EMAIL}"}]
    binding = one(resources, "gcp:serviceaccount/iAMMember:IAMMember", "serving-workload-identity").inputs
    assert binding["member"] == f"serviceAccount:{PROJECT_ID}.svc.id.goog[training/vllm]"
    account = one(resources, "kubernetes:core/v1:ServiceAccount", "serving-service-account").inputs
    assert account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"] == SERVING_EMAIL
    assert pod_spec(resources)["serviceAccountName"] == "vllm"


def test_the_image_comes_pinned_through_the_stacks_docker_hub_repository():
    resources = previewed("serving").resources
    mirror = one(resources, REPOSITORY, "docker-hub").inputs
    assert (mirror["mode"], mirror["remoteRepositoryConfig"]["dockerRepository"]["publicRepository"]) == ("REMOTE_REPOSITORY", "DOCKER_HUB")
    prefix = f"us-east5-docker.pkg.dev/{PROJECT_ID}/{mirror_repository_id('gemma-serving')}/vllm/vllm-tpu@sha256:"
    assert {c["image"] for c in pod_spec(resources)["containers"]} == {
        stack_values("serving")["gemma-tpu:serving"]["image"].replace("vllm/vllm-tpu@sha256:", prefix)
    }
    (smoke,) = one(resources, JOB, "vllm-smoke").inputs["spec"]["template"]["spec"]["containers"]
    assert smoke["image"].startswith(f"us-east5-docker.pkg.dev/{PROJECT_ID}/{mirror_repository_id('gemma-serving')}/library/python:")
    reader = one(resources, "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember", "nodes-pull-docker-hub").inputs
    assert reader["role"] == "roles/artifactregistry.reader" and reader["member"].startswith("serviceAccount:gemma-serving-nodes@")


def test_images_of_another_registry_need_no_mirror():
    image = "us-docker.pkg.dev/acme/tpu/vllm-tpu@sha256:" + "d" * 64
    resources = serving_preview(image=image, smokeImage="us-docker.pkg.dev/acme/tpu/python@sha256:" + "e" * 64).resources
    assert [r.name for r in of_type(resources, REPOSITORY)] == ["trainer-images"]
    assert {c["image"] for c in pod_spec(resources)["containers"]} == {image}


def test_the_server_starts_after_its_pool_identity_and_image_and_the_smoke_job_after_it():
    resources = previewed("serving").resources
    deployment = one(resources, DEPLOYMENT, "vllm")
    assert {SERVING_POOL, "serving-reads-artifacts", "serving-workload-identity", "serving-service-account",
            "nodes-pull-docker-hub"} <= set(deployment.depends_on)  # fmt: skip
    smoke = one(resources, JOB, "vllm-smoke")
    assert "vllm" in smoke.depends_on
    assert (DEPLOYMENT, "vllm") in prerequisites(resources, smoke)


def test_outputs_give_the_port_forward_the_curl_and_the_smoke_result():
    outputs = previewed("serving").outputs
    assert outputs["serving"]["portForward"] == "kubectl port-forward -n training service/vllm 8000:8000"
    assert outputs["serving"]["curl"].startswith("curl -s localhost:8000/v1/chat/completions ")
    assert '"model": "tinystories"' in outputs["serving"]["curl"] and outputs["serving"]["model"] == "tinystories"
    assert "servingSmoke" in outputs
    assert serving_preview(replicas=0).outputs["servingSmoke"].startswith("no replicas")


def test_the_cost_output_says_what_an_idle_serving_replica_costs():
    from infra.pricing import PRICE_PER_CHIP_HOUR_USD

    replica = previewed("serving").outputs["tpuCostPerHourUsd"]["servingReplica"]
    assert (replica["chips"], replica["onDemand"]) == (1, PRICE_PER_CHIP_HOUR_USD["v6e"].on_demand)  # one v6e chip
    assert "servingReplica" not in previewed("dev").outputs["tpuCostPerHourUsd"]


def test_zero_replicas_keeps_the_pool_and_runs_no_smoke_job():
    resources = serving_preview(replicas=0).resources
    assert one(resources, NODE_POOL, SERVING_POOL).inputs["autoscaling"]["totalMinNodeCount"] == 0
    assert one(resources, DEPLOYMENT, "vllm").inputs["spec"]["replicas"] == 0
    assert [r.name for r in of_type(resources, JOB) if r.name == "vllm-smoke"] == []


def test_autopilot_serves_without_a_pool():
    values = stack_values("serving", **{"gemma-tpu:cluster": {"mode": "autopilot"}})
    resources = preview(values, "serving").resources
    assert [r for r in of_type(resources, NODE_POOL) if r.name == SERVING_POOL] == []
    assert "cloud.google.com/gke-nodepool" not in pod_spec(resources)["nodeSelector"]


def test_a_stack_without_serving_declares_none_of_it():
    resources = previewed("dev").resources
    assert not [r for r in resources if "serving" in r.name or r.name in ("vllm", "vllm-smoke", "docker-hub")]
    assert "serving" not in previewed("dev").outputs


def test_destroy_removes_the_serving_objects_before_their_pool_and_protects_none():
    resources = previewed("serving").resources
    serving = [r for r in resources if r.parent == "serving" or r.name.startswith("serving")]
    assert serving and not [r.name for r in serving if r.protect or r.retain_on_delete]
    deployment = one(resources, DEPLOYMENT, "vllm")
    assert (NODE_POOL, SERVING_POOL) in prerequisites(resources, deployment)


@pytest.mark.parametrize(
    ("serving_keys", "message"),
    [
        ({"run": "nope"}, "gemma-tpu:serving.run is 'nope', which is no run of this stack"),
        ({"image": "vllm/vllm-tpu:latest"}, "gemma-tpu:serving.image 'vllm/vllm-tpu:latest' is not pinned by digest"),
        ({"topology": "4x4"}, "gemma-tpu:serving.topology v6e 4x4 spans 4 hosts"),
        ({"maxModelLen": 65536}, "gemma-tpu:serving.maxModelLen is 65536, above gemma3-1b's 32768"),
        ({"lora": "adapter"}, "gemma-tpu:serving.lora is adapter, but run 'tinystories' is a full fine-tune"),
    ],
)  # fmt: skip
def test_a_bad_serving_config_is_one_line_and_exit_2_before_any_resource(tmp_path, serving_keys, message):
    document = yaml.safe_load((PROJECT_ROOT / "Pulumi.serving.yaml").read_text())
    document["config"]["gemma-tpu:serving"].update(serving_keys)
    stack_file = tmp_path / "Pulumi.serving.yaml"
    stack_file.write_text(yaml.safe_dump(document))
    result = subprocess.run([sys.executable, "-m", "infra.preview", "--stack", str(stack_file)],
                            cwd=PROJECT_ROOT, capture_output=True, text=True, check=False)  # fmt: skip
    assert result.returncode == USER_ERROR
    lines = [line for line in result.stderr.splitlines() if not line.startswith("note:")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert result.stdout == ""  # nothing was declared


def _bucket_holds(monkeypatch, **versions: list[str]) -> None:
    """The artifacts bucket, as `pulumi up` lists and reads it, holds these published versions of the
    run, each holding the parts listed (in its marker)."""
    markers = {}

    def call(self, args):
        if args.token == "gcp:storage/getBucketObjects:getBucketObjects":
            markers.update({args.args["matchGlob"].replace("*", version): parts for version, parts in versions.items()})
            return {"bucket": args.args["bucket"], "bucketObjects": [
                {"name": name, "mediaLink": "", "selfLink": "", "contentType": "application/json", "storageClass": "STANDARD"}
                for name in markers]}  # fmt: skip
        if args.token == "gcp:storage/getBucketObjectContent:getBucketObjectContent":
            return {"bucket": args.args["bucket"], "name": args.args["name"],
                    "content": json.dumps({"run": "tinystories", "parts": markers[args.args["name"]]})}
        return {}

    monkeypatch.setattr(preview_module._CloudPlaceholders, "call", call)


def _smoke(resources) -> dict:
    return one(resources, JOB, "vllm-smoke").inputs


def test_nothing_published_no_tpu_pod_and_a_suspended_smoke_job(monkeypatch):
    """Before the run publishes, `pulumi up` applies the Deployment at zero replicas (no TPU node) and
    the smoke Job suspended, and says why; with a version it serves the newest, awaits the answer."""
    resources, outputs = previewed("serving").resources, previewed("serving").outputs
    assert one(resources, DEPLOYMENT, "vllm").inputs["spec"]["replicas"] == 0
    job = _smoke(resources)
    assert job["metadata"]["annotations"] == {"pulumi.com/skipAwait": "true"} and job["spec"]["suspend"] is True
    assert outputs["servingSmoke"].startswith("no version answered yet: none in gs://acme-ml-123-serving-artifacts/published/tinystories holds hf")

    _bucket_holds(monkeypatch, **{"20261201T000000Z-tinystories-aaaa": ["hf"], "20261205T120000Z-tinystories-bbbb": ["hf"]})
    published = preview(stack_values("serving"), "serving")
    deployment = one(published.resources, DEPLOYMENT, "vllm").inputs["spec"]
    assert deployment["replicas"] == 1
    (model,) = [v for v in deployment["template"]["spec"]["volumes"] if "csi" in v]
    assert "only-dir=published/tinystories/20261205T120000Z-tinystories-bbbb" in model["csi"]["volumeAttributes"]["mountOptions"]
    job = _smoke(published.resources)
    assert job["metadata"]["annotations"] == {"pulumi.com/skipAwait": "false"}
    assert published.outputs["servingSmoke"] == ("answered by 20261205T120000Z-tinystories-bbbb itself (asked as "
                                                 "tinystories@20261205T120000Z-tinystories-bbbb); read the answer with: "
                                                 f"kubectl logs -n training job/{job['metadata']['name']}")


def test_a_new_version_has_a_smoke_job_of_its_own_that_answers_for_it(monkeypatch):
    _bucket_holds(monkeypatch, **{"20261201T000000Z-tinystories-aaaa": ["hf"]})
    first = _smoke(preview(stack_values("serving"), "serving").resources)["metadata"]["name"]
    _bucket_holds(monkeypatch, **{"20261201T000000Z-tinystories-aaaa": ["hf"], "20261205T120000Z-tinystories-bbbb": ["hf"]})
    rolled = preview(stack_values("serving"), "serving")
    second = _smoke(rolled.resources)["metadata"]["name"]
    assert first != second  # a new Job, which asks the new version again
    assert rolled.outputs["servingSmoke"].startswith("answered by 20261205T120000Z-tinystories-bbbb itself")


def test_adapter_serving_serves_the_newest_version_with_a_base_and_an_adapter(monkeypatch):
    values = stack_values("serving")
    values["gemma-tpu:serving"] = {**values["gemma-tpu:serving"], "lora": "adapter"}
    values["gemma-tpu:training"] = {**values["gemma-tpu:training"], "loraRank": 16}
    _bucket_holds(monkeypatch, **{"20261205T120000Z-tinystories-bbbb": ["hf"]})
    merged_only = preview(values, "serving")
    assert one(merged_only.resources, DEPLOYMENT, "vllm").inputs["spec"]["replicas"] == 0  # no --model=/model/base to crash on
    assert merged_only.outputs["servingSmoke"].startswith("no version answered yet: none in gs://")
    assert "holds base and adapter" in merged_only.outputs["servingSmoke"]
    _bucket_holds(monkeypatch, **{"20261201T000000Z-tinystories-aaaa": ["adapter", "base"], "20261205T120000Z-tinystories-bbbb": ["hf"]})
    served = preview(values, "serving")
    deployment = one(served.resources, DEPLOYMENT, "vllm").inputs["spec"]
    (model,) = [v for v in deployment["template"]["spec"]["volumes"] if "csi" in v]
    assert "only-dir=published/tinystories/20261201T000000Z-tinystories-aaaa" in model["csi"]["volumeAttributes"]["mountOptions"]
    (trainer,) = one(served.resources, JOB, "training").inputs["spec"]["template"]["spec"]["containers"]
    assert trainer["args"][trainer["args"].index("--publish-parts") + 1] == "base,adapter"  # what its serving serves
