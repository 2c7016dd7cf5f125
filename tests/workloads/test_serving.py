"""The serving objects (workloads.serving): what vLLM is started with, where it runs, what it may
read, and that each object passes its schema and the admission rules of its controllers."""

import copy
import json

import pytest

from infra.config.serving import mirror_repository_id, serving_account_id
from tests.workloads.admission import violations
from tests.workloads.admission_serving import SERVING_RULES, validate_pod_monitoring
from tests.workloads.conftest import container, edited_config, spec_of
from tests.workloads.schemas import validate_builtin
from workloads import serving
from workloads.__main__ import stack_objects

UPSTREAM = "vllm/vllm-tpu:v0.27.0@sha256:" + "b" * 64
VARIANTS = {
    "merged": {},
    "adapter": {"lora": "adapter"},
    "autoscaled": {"replicas": 1, "autoscaling": {"maxReplicas": 3, "queueDepth": 4}},
    "zero": {"replicas": 0},
    "v5p": {"accelerator": "v5p", "topology": "2x2x1", "capacity": "spot"},
    "four-chips": {"topology": "2x2"},
}


def serving_config(serving_keys=None, *, stack="dev", **sections):
    keys = {"enabled": True, "image": UPSTREAM, **(serving_keys or {})}
    training = {"loraRank": 16} if (serving_keys or {}).get("lora") == "adapter" else {}
    return edited_config(stack, serving=keys, training=training, **sections)


def spec(serving_keys=None, **kwargs) -> serving.ServingSpec:
    config = serving_config(serving_keys, **kwargs)
    return serving.serving_spec(config, spec_of(config))


def objects_by_kind(serving_spec) -> dict[str, dict]:
    return {obj["kind"]: obj for obj in serving.serving_objects(serving_spec)}


def pod(serving_spec) -> dict:
    return serving.deployment(serving_spec)["spec"]["template"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_serving_object_passes_its_schema_and_the_admission_rules(variant):
    for obj in serving.serving_objects(spec(VARIANTS[variant])):
        (validate_pod_monitoring if obj["kind"] == "PodMonitoring" else validate_builtin)(obj)
        assert violations(obj) == [], obj["kind"]


def test_the_stack_renders_serving_after_the_runs():
    kinds = [obj["kind"] for obj in stack_objects(serving_config(VARIANTS["autoscaled"]))]
    assert kinds[-6:] == ["ServiceAccount", "Deployment", "Service", "PodMonitoring", "HorizontalPodAutoscaler", "Job"]
    assert "Deployment" not in [obj["kind"] for obj in stack_objects(edited_config("dev"))]


def test_vllm_runs_tensor_parallel_over_the_slices_chips_on_the_slices_nodes():
    for keys, chips, selector in (({}, 1, {"cloud.google.com/gke-tpu-topology": "1x1"}),
                                  ({"topology": "2x2"}, 4, {"cloud.google.com/gke-tpu-topology": "2x2"}),
                                  (VARIANTS["v5p"], 4, {"cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
                                                        "cloud.google.com/gke-spot": "true"})):  # fmt: skip
        template = pod(spec(keys))
        server = container(template, serving.SERVER_CONTAINER)
        assert f"--tensor-parallel-size={chips}" in server["args"]
        assert server["resources"]["limits"]["google.com/tpu"] == str(chips)
        assert selector.items() <= template["spec"]["nodeSelector"].items()


def test_the_run_is_served_under_its_own_name_from_its_export():
    config = serving_config({"maxModelLen": 4096})
    serving_spec = serving.serving_spec(config, spec_of(config))
    args = container(pod(serving_spec), serving.SERVER_CONTAINER)["args"]
    assert {"--model=/model/hf", "--served-model-name=gemma-finetune", "--max-model-len=4096", "--port=8000"} <= set(args)
    assert serving_spec.export_dir == f"{spec_of(config).run_dir}/export"


def test_an_adapter_is_served_on_the_base_under_the_runs_name():
    args = container(pod(spec(VARIANTS["adapter"])), serving.SERVER_CONTAINER)["args"]
    assert {"--model=/model/base", "--enable-lora", "--lora-modules=gemma-finetune=/model/adapter", "--max-lora-rank=16",
            "--served-model-name=gemma-finetune-base"} <= set(args)  # fmt: skip


def test_the_export_is_mounted_read_only_and_alone():
    serving_spec = spec()
    template = pod(serving_spec)
    (volume,) = [v for v in template["spec"]["volumes"] if "csi" in v]
    attributes = volume["csi"]["volumeAttributes"]
    assert volume["csi"]["readOnly"] is True and attributes["bucketName"] == serving_spec.artifacts_bucket
    assert f"only-dir={serving_spec.export_dir}" in attributes["mountOptions"].split(",")
    mounts = [m for c in template["spec"]["initContainers"] + template["spec"]["containers"] for m in c.get("volumeMounts", [])]
    assert all(m["readOnly"] for m in mounts if m["name"] == volume["name"])


def test_the_wait_names_the_export_and_the_writable_cache_is_not_on_it():
    for keys, awaited in (({}, ["/model/hf/config.json"]),
                          (VARIANTS["adapter"], ["/model/base/config.json", "/model/adapter/adapter_config.json"])):  # fmt: skip
        serving_spec = spec(keys)
        template = pod(serving_spec)
        script = container(template, serving.WAIT_CONTAINER)["command"][-1]
        assert all(path in script for path in awaited)
        assert f"gs://{serving_spec.artifacts_bucket}/{serving_spec.export_dir}/" in script and "waiting for" in script
    server = container(template, serving.SERVER_CONTAINER)
    cache = {e["name"]: e["value"] for e in server["env"]}["VLLM_XLA_CACHE_PATH"]
    (cache_mount,) = [m for m in server["volumeMounts"] if m["mountPath"] == cache]
    (cache_volume,) = [v for v in template["spec"]["volumes"] if v["name"] == cache_mount["name"]]
    assert "emptyDir" in cache_volume and not cache_mount.get("readOnly")
    (shm,) = [v for v in template["spec"]["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"]["medium"] == "Memory"


def test_probes_allow_a_long_first_compile():
    server = container(pod(spec()), serving.SERVER_CONTAINER)
    startup = server["startupProbe"]
    assert startup["httpGet"]["path"] == "/health"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 45 * 60
    assert server["readinessProbe"]["httpGet"]["path"] == server["livenessProbe"]["httpGet"]["path"] == "/health"


def test_service_monitoring_and_autoscaler_select_the_servers_pods():
    serving_spec = spec(VARIANTS["autoscaled"])
    objects = objects_by_kind(serving_spec)
    template = objects["Deployment"]["spec"]["template"]
    labels = template["metadata"]["labels"]
    port_names = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
    service, monitoring, hpa = objects["Service"], objects["PodMonitoring"], objects["HorizontalPodAutoscaler"]
    assert service["spec"]["type"] == "ClusterIP" and service["spec"]["ports"][0]["port"] == 8000
    assert service["spec"]["selector"].items() <= labels.items() and service["spec"]["ports"][0]["targetPort"] in port_names
    assert monitoring["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert monitoring["spec"]["endpoints"][0]["port"] in port_names and monitoring["spec"]["endpoints"][0]["path"] == "/metrics"
    assert hpa["spec"]["scaleTargetRef"]["name"] == objects["Deployment"]["metadata"]["name"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 3)
    assert "vllm:num_requests_waiting" in hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]


def test_zero_replicas_has_no_smoke_job_and_no_autoscaler():
    kinds = set(objects_by_kind(spec(VARIANTS["zero"])))
    assert "Job" not in kinds and "HorizontalPodAutoscaler" not in kinds
    assert objects_by_kind(spec(VARIANTS["zero"]))["Deployment"]["spec"]["replicas"] == 0


def test_the_smoke_job_asks_the_served_model_through_the_service():
    serving_spec = spec()
    script = container(serving.smoke_job(serving_spec)["spec"]["template"], serving.SMOKE_CONTAINER)["command"][-1]
    compile(script, "smoke", "exec")  # the Job runs it with python3 -c
    assert "http://vllm.training.svc:8000" in script and "/v1/chat/completions" in script and "/health" in script
    assert serving.chat_request(serving_spec)["model"] == "gemma-finetune"
    commands = serving.serving_commands(serving_spec)
    assert commands["portForward"] == "kubectl port-forward -n training service/vllm 8000:8000"
    body = commands["curl"].split(" -d ", 1)[1].strip("'")
    assert json.loads(body)["model"] == "gemma-finetune"


def test_a_docker_hub_image_is_pulled_through_the_stacks_remote_repository():
    config = serving_config()
    image = serving.served_image(config)
    assert image == f"us-east5-docker.pkg.dev/{config.project}/{mirror_repository_id(config.cluster_name)}/{UPSTREAM}"
    other = serving_config({"image": "us-docker.pkg.dev/acme/mirror/vllm-tpu@sha256:" + "c" * 64})
    assert serving.served_image(other) == "us-docker.pkg.dev/acme/mirror/vllm-tpu@sha256:" + "c" * 64


def test_the_google_account_is_within_the_stack_name_limit():
    from infra.config import STACK_NAME_MAX

    config = serving_config()
    longest = config.cluster_name.replace(config.stack, "s" * STACK_NAME_MAX)
    assert len(serving_account_id(longest)) <= 30


BREAKS = [
    ("Deployment", lambda o: o["spec"]["selector"]["matchLabels"].update(app="other"), "deployment"),
    ("Deployment", lambda o: o["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["httpGet"].update(port="web"), "deployment"),
    ("Deployment", lambda o: o["spec"]["template"]["spec"]["volumes"][0]["csi"]["volumeAttributes"].update(
        mountOptions="allow_other"), "gcs-fuse-volumes"),
    ("Deployment", lambda o: o["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"].update(
        {"google.com/tpu": "2"}), "extended-resources"),
    ("PodMonitoring", lambda o: o["spec"]["endpoints"][0].pop("interval"), "pod-monitoring"),
    ("PodMonitoring", lambda o: o["spec"]["endpoints"][0].update(timeout="1m"), "pod-monitoring"),
    ("HorizontalPodAutoscaler", lambda o: o["spec"].update(minReplicas=0), "horizontal-pod-autoscaler"),
    ("Service", lambda o: o["spec"]["ports"].append({"port": 9000}), "service"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "breaks", "rule"), BREAKS)
def test_the_admission_rules_catch_a_broken_serving_object(kind, breaks, rule):
    obj = copy.deepcopy(objects_by_kind(spec(VARIANTS["autoscaled"]))[kind])
    breaks(obj)
    assert any(f"{rule}: " in line for line in violations(obj)), violations(obj)


def test_every_serving_rule_has_a_case_that_breaks_it():
    assert set(SERVING_RULES) <= {rule for _, _, rule in BREAKS}
