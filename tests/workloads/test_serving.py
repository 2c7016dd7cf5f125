"""The serving objects (workloads.serving): what vLLM is started with, which published version it
serves, where it runs, what it may read, and that each object passes its schema and the admission
rules of its controllers."""

import copy
import json

import pytest
import yaml

from infra.config.serving import SERVED_MODELS, mirror_repository_id, mirrored_image, serving_account_id
from tests.workloads.admission import violations
from tests.workloads.admission_serving import SERVING_RULES, validate_pod_monitoring
from tests.workloads.conftest import container, edited_config, spec_of
from tests.workloads.schemas import validate_builtin
from workloads import deploy, serving
from workloads.__main__ import stack_objects

UPSTREAM = "vllm/vllm-tpu:v0.27.0@sha256:" + "b" * 64
VERSION = "20261205T120000Z-gemma-finetune-0123abcd"
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
    return edited_config(stack, serving=keys, training={**training, **sections.pop("training", {})}, **sections)


def spec(serving_keys=None, *, version=VERSION, **kwargs) -> serving.ServingSpec:
    config = serving_config(serving_keys, **kwargs)
    return serving.serving_spec(config, spec_of(config), version)


def newest(published_dir, object_names) -> str | None:
    """The newest complete version among `object_names`, as `pulumi up` finds it (every marker holding hf)."""
    return next(iter(deploy.versions_newest_first(published_dir, object_names)), (None,))[0]


def objects_by_kind(serving_spec) -> dict[str, dict]:
    return {obj["kind"]: obj for obj in serving.serving_objects(serving_spec)}


def pod(serving_spec) -> dict:
    return serving.deployment(serving_spec)["spec"]["template"]


@pytest.mark.parametrize("version", [VERSION, None])
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_serving_object_passes_its_schema_and_the_admission_rules(variant, version):
    for obj in serving.serving_objects(spec(VARIANTS[variant], version=version)):
        (validate_pod_monitoring if obj["kind"] == "PodMonitoring" else validate_builtin)(obj)
        assert violations(obj) == [], obj["kind"]


def test_the_stack_renders_serving_after_the_runs():
    kinds = [obj["kind"] for obj in stack_objects(serving_config(VARIANTS["autoscaled"]), VERSION)]
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


def test_the_run_is_served_under_its_own_name_from_its_published_version():
    config = serving_config({"maxModelLen": 4096})
    serving_spec = serving.serving_spec(config, spec_of(config), VERSION)
    args = container(pod(serving_spec), serving.SERVER_CONTAINER)["args"]
    assert {"--model=/model/hf", "--max-model-len=4096", "--port=8000"} <= set(args)
    # The version's own name first: vLLM names it in its answers, and the smoke Job asks it.
    names = args.index("--served-model-name")
    assert args[names + 1:names + 3] == [f"gemma-finetune@{VERSION}", "gemma-finetune"]
    assert serving_spec.version_dir == f"published/gemma-finetune/{VERSION}"
    trainer_args = spec_of(config).trainer_args
    assert ("--publish-dir", f"/artifacts/{serving_spec.published_dir}") in zip(trainer_args, trainer_args[1:])


def test_a_trainer_image_change_or_a_new_run_leaves_the_served_model_unchanged_until_a_version_is_published():
    config, retrained = serving_config(), serving_config(training={"steps": 777})
    runs = {"first": spec_of(config), "rebuilt": spec_of(config, image="europe-docker.pkg.dev/p/r/trainer@sha256:" + "d" * 64),
            "retrained": spec_of(retrained)}  # fmt: skip
    assert len({run.run_dir for run in runs.values()}) == 3  # three runs, each in a directory of its own...
    published = [f"{runs['first'].publish_dir}/{VERSION}/published.json"]  # ...and the bucket holds the first's version
    served = [serving.deployment(serving.serving_spec(run_config, run, newest(run.publish_dir, published)))
              for run_config, run in ((config, runs["first"]), (config, runs["rebuilt"]), (retrained, runs["retrained"]))]
    assert served[0] == served[1] == served[2]  # the same pods, untouched by the rebuild and the new run
    newer = "20261206T080000Z-" + runs["retrained"].name  # the new run publishes
    assert newest(runs["retrained"].publish_dir, [*published, f"{runs['retrained'].publish_dir}/{newer}/published.json"]) == newer
    rolled = serving.deployment(serving.serving_spec(retrained, runs["retrained"], newer))
    assert rolled["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert rolled["spec"]["template"] != served[0]["spec"]["template"]  # the new version rolls out


def test_only_complete_versions_of_the_runs_folder_are_served():
    folder = "published/gemma-finetune"
    names = [f"{folder}/{VERSION}/hf/config.json", f"{folder}/.{VERSION}.partial-ab12/published.json",
             "published/gemma-finetune-2/20991231T000000Z-x/published.json", f"{folder}/{VERSION}/published.json"]  # fmt: skip
    assert newest(folder, names) == VERSION
    assert newest(folder, names[:3]) is None


@pytest.mark.parametrize(("mode", "holding", "held"), [
    ("merged", ["hf"], True), ("merged", ["adapter", "base"], False),
    ("adapter", ["hf"], False), ("adapter", ["adapter", "base"], True), ("adapter", ["adapter", "base", "hf"], True),
])  # fmt: skip
def test_a_version_serves_a_mode_only_when_its_marker_names_the_parts_the_mode_needs(mode, holding, held):
    parts = spec({"lora": mode}).parts
    assert deploy.holds(json.dumps({"run": "r", "parts": holding}), parts, source="marker", warn=pytest.fail) is held


def test_a_marker_that_names_no_parts_serves_nothing_and_is_said_once():
    warnings = []
    bad = ("", "not json", "[]", json.dumps({"run": "r"}), json.dumps({"run": "r", "parts": None}))
    assert not any(deploy.holds(text, ("hf",), source=f"m{number}", warn=warnings.append) for number, text in enumerate(bad))
    assert warnings == [
        "m0: not a version's marker (not JSON); that version is left out",
        "m1: not a version's marker (not JSON); that version is left out",
        "m2: not a version's marker (a JSON list, not an object); that version is left out",
        "m3: not a version's marker (\"parts\" is not a list of names); that version is left out",
        "m4: not a version's marker (\"parts\" is not a list of names); that version is left out",
    ]
    assert not deploy.holds(None, ("hf",), source="gone", warn=pytest.fail)  # no marker: nothing to say


def test_each_served_version_has_a_smoke_job_of_its_own():
    first, second = spec(), spec(version="20261206T080000Z-gemma-finetune-0123abcd")
    names = {serving.smoke_job(s)["metadata"]["name"] for s in (first, second, spec(version=None))}
    assert len(names) == 3 and all(len(name) <= 63 for name in names)
    assert serving.serving_commands(second)["smokeLogs"].endswith(f"job/{serving.smoke_job(second)['metadata']['name']}")


def test_no_pod_requests_a_tpu_before_an_export_is_published():
    for variant in ("merged", "autoscaled", "four-chips"):
        objects = objects_by_kind(spec(VARIANTS[variant], version=None))
        assert objects["Deployment"]["spec"]["replicas"] == 0
        assert objects["Job"]["spec"]["suspend"] is True
        assert "google.com/tpu" not in json.dumps(objects["Job"])
        if "HorizontalPodAutoscaler" in objects:  # Kubernetes' HPA leaves a target at zero replicas alone
            assert objects["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["name"] == objects["Deployment"]["metadata"]["name"]
    served = objects_by_kind(spec())
    assert served["Deployment"]["spec"]["replicas"] == 1 and served["Job"]["spec"]["suspend"] is False


def test_an_adapter_is_served_on_the_base_under_the_runs_name():
    args = container(pod(spec(VARIANTS["adapter"])), serving.SERVER_CONTAINER)["args"]
    assert {"--model=/model/base", "--enable-lora", "--max-lora-rank=16", "--served-model-name=gemma-finetune-base"} <= set(args)
    modules = args.index("--lora-modules")
    assert args[modules + 1:modules + 3] == [f"gemma-finetune@{VERSION}=/model/adapter", "gemma-finetune=/model/adapter"]


def test_the_version_is_mounted_read_only_and_alone():
    serving_spec = spec()
    template = pod(serving_spec)
    (volume,) = [v for v in template["spec"]["volumes"] if "csi" in v]
    attributes = volume["csi"]["volumeAttributes"]
    assert volume["csi"]["readOnly"] is True and attributes["bucketName"] == serving_spec.artifacts_bucket
    assert f"only-dir=published/gemma-finetune/{VERSION}" in attributes["mountOptions"].split(",")
    assert "initContainers" not in template["spec"]  # nothing waits: the version is complete when it is served
    mounts = [m for c in template["spec"]["containers"] for m in c.get("volumeMounts", [])]
    assert all(m["readOnly"] for m in mounts if m["name"] == volume["name"])


def test_the_model_mount_caches_the_whole_export_with_parallel_downloads():
    for model in ("gemma3-1b", "gemma3-12b"):
        serving_spec = spec({"topology": "2x4"} if model == "gemma3-12b" else {}, training={"model": model})
        template = pod(serving_spec)
        (volume,) = [v for v in template["spec"]["volumes"] if "csi" in v]
        options = volume["csi"]["volumeAttributes"]["mountOptions"].split(",")
        export_mib = SERVED_MODELS[model].export_bytes / 2**20
        (size,) = [int(o.rsplit(":", 1)[1]) for o in options if o.startswith("file-cache:max-size-mb:")]
        assert export_mib < size <= export_mib + 1025
        assert {"file-cache:cache-file-for-range-read:true", "file-cache:enable-parallel-downloads:true",
                "metadata-cache:ttl-secs:-1", "metadata-cache:stat-cache-max-size-mb:-1"} <= set(options)  # fmt: skip
        (cache,) = [v for v in template["spec"]["volumes"] if v["name"] == "gke-gcsfuse-cache"]
        assert int(cache["emptyDir"]["sizeLimit"].removesuffix("Gi")) * 1024 >= size
        annotations = template["metadata"]["annotations"]
        assert annotations["gke-gcsfuse/memory-limit"] == annotations["gke-gcsfuse/cpu-limit"] == "0"
        assert annotations["gke-gcsfuse/ephemeral-storage-limit"] == "0" and "gke-gcsfuse/memory-request" in annotations


def test_the_file_cache_is_in_memory_only_where_the_host_holds_it_beside_vllm():
    assert spec().file_cache_in_memory  # 1b on ct6e-standard-1t (448 GB)
    small_host = spec({"accelerator": "v5e", "topology": "1x1"}, training={"model": "gemma3-4b"})  # 7 GiB on a 48 GB host
    assert not small_host.file_cache_in_memory
    template = pod(small_host)
    (cache,) = [v for v in template["spec"]["volumes"] if v["name"] == "gke-gcsfuse-cache"]
    assert "medium" not in cache["emptyDir"]
    disk = container(template, serving.SERVER_CONTAINER)["resources"]["requests"]["ephemeral-storage"]
    assert disk == f"{int(cache['emptyDir']['sizeLimit'].removesuffix('Gi')) + 20}Gi"  # the cache on disk, and the XLA cache


def test_the_sidecar_limits_are_lifted_on_standard_only():
    assert pod(spec())["metadata"]["annotations"]["gke-gcsfuse/cpu-limit"] == "0"
    autopilot = pod(spec(cluster={"mode": "autopilot"}))["metadata"]["annotations"]
    assert autopilot == {"gke-gcsfuse/volumes": "true"}


def test_the_writable_caches_are_not_on_the_model():
    template = pod(spec())
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


def test_the_smoke_job_asks_the_served_model_through_the_service_from_a_small_image():
    serving_spec = spec()
    job = serving.smoke_job(serving_spec)
    smoke = container(job["spec"]["template"], serving.SMOKE_CONTAINER)
    assert smoke["image"] != serving_spec.image and "python" in smoke["image"] and "@sha256:" in smoke["image"]
    assert job["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    script = smoke["command"][-1]
    assert script == serving.smoke_script(serving_spec)
    assert serving.chat_request(serving_spec)["model"] == "gemma-finetune"
    commands = serving.serving_commands(serving_spec)
    assert commands["portForward"] == "kubectl port-forward -n training service/vllm 8000:8000"
    body = commands["curl"].split(" -d ", 1)[1].strip("'")
    assert json.loads(body)["model"] == "gemma-finetune"


def test_a_docker_hub_image_is_pulled_through_the_stacks_remote_repository():
    config = serving_config()
    mirror = f"us-east5-docker.pkg.dev/{config.project}/{mirror_repository_id(config.cluster_name)}"
    assert mirrored_image(config, UPSTREAM) == f"{mirror}/{UPSTREAM}"
    assert spec().smoke_image == f"{mirror}/library/{config.serving.smoke_image}"
    other = "us-docker.pkg.dev/acme/mirror/vllm-tpu@sha256:" + "c" * 64
    assert mirrored_image(config, other) == other


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


def test_render_shows_the_serving_of_a_version_or_of_none(capsys):
    from workloads.__main__ import main

    def rendered_deployment(*argv):
        assert main(["render", "--stack", "serving", *argv]) == 0
        (deployment,) = [obj for obj in yaml.safe_load_all(capsys.readouterr().out) if obj and obj["kind"] == "Deployment"]
        return deployment

    assert rendered_deployment()["spec"]["replicas"] == 0
    served = rendered_deployment("--served-version", VERSION)
    assert served["spec"]["replicas"] == 1
    assert f"only-dir=published/tinystories/{VERSION}" in json.dumps(served)


class _Rollout:
    """The Service during a rollout, as urllib sees it: nothing ready, then only the old version's pod,
    which answers to the run's name and 404 to any other, then the new version's pod."""

    def __init__(self, new_model: str):
        self.new_model, self.asked = new_model, []

    def __call__(self, request, timeout):
        import io
        import urllib.error

        model = json.loads(request.data)["model"]
        self.asked.append(model)
        if len(self.asked) == 1:
            raise urllib.error.URLError("connection refused")
        if len(self.asked) == 2 and model != "gemma-finetune":
            raise urllib.error.HTTPError(request.full_url, 404, f"The model `{model}` does not exist.", None, None)
        served = "the old version" if len(self.asked) == 2 else model
        answer = {"model": model, "choices": [{"message": {"content": f"hello from {served}"}}]}
        return io.BytesIO(json.dumps(answer).encode())


def test_the_smoke_job_asks_the_new_version_itself_and_waits_through_the_rollout(monkeypatch, capsys):
    """The Job asked the run's name, which any ready pod answers (the old one during a rollout, maxSurge 1):
    "answered by VERSION" named a version that may never have answered. It asks <run>@<version>, which only
    the new version's pods answer; the old pod's 404 is waited through like a server not up yet."""
    import time
    import urllib.request

    serving_spec = spec()
    rollout = _Rollout(serving_spec.version_model)
    monkeypatch.setattr(urllib.request, "urlopen", rollout)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    exec(serving.smoke_script(serving_spec), {})
    assert rollout.asked == [f"gemma-finetune@{VERSION}"] * 3
    assert capsys.readouterr().out.splitlines()[-1] == (f"answer of gemma-finetune@{VERSION}: hello from "
                                                        f"gemma-finetune@{VERSION}")


def test_a_refusal_other_than_an_unknown_model_fails_the_smoke_job(monkeypatch):
    import time
    import urllib.error
    import urllib.request

    asked = []

    def refuses(request, timeout):
        asked.append(request)
        assert len(asked) == 1, "asked again after a 400"
        raise urllib.error.HTTPError(request.full_url, 400, "bad request", None, None)

    monkeypatch.setattr(urllib.request, "urlopen", refuses)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    with pytest.raises(urllib.error.HTTPError):
        exec(serving.smoke_script(spec()), {})


def _adapter_stack(tmp_path) -> str:
    """The serving stack with gemma-tpu:serving.lora adapter, as a stack file."""
    values = yaml.safe_load(open("Pulumi.serving.yaml"))
    values["config"]["gemma-tpu:serving"]["lora"] = "adapter"
    values["config"]["gemma-tpu:training"]["loraRank"] = 16
    values["config"]["gcp:project"] = "acme-ml-123"
    path = tmp_path / "Pulumi.adapter.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def test_render_applies_the_parts_rule_to_a_version_it_is_given(tmp_path, capsys):
    """`render --served-version` of a version holding only hf, on a stack serving an adapter, rendered vLLM
    with --model=/model/base, which the version does not hold: the rule was `pulumi up`'s choice alone."""
    from workloads.__main__ import main

    adapter_stack = _adapter_stack(tmp_path)
    merged_only = "20261205T120000Z-tinystories-0123abcd.hf"
    assert main(["render", "--stack", adapter_stack, "--served-version", merged_only]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        f"error: --served-version {merged_only}: it holds hf, and gemma-tpu:serving.lora adapter serves base and adapter; "
        "name a version that holds them\n")
    assert main(["render", "--stack", adapter_stack, "--served-version", "20261205T120000Z-tinystories-0123abcd.adapter+base"]) == 0
    assert "--model=/model/base" in capsys.readouterr().out
    assert main(["render", "--stack", "serving", "--served-version", merged_only]) == 0
    capsys.readouterr()
    assert main(["render", "--stack", "dev", "--served-version", merged_only]) == 2
    assert capsys.readouterr().err.endswith(f"\nerror: --served-version {merged_only}: the stack has no gemma-tpu:serving to serve it\n")
