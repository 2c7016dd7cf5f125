"""Pure builders of the serving objects (gemma-tpu:serving): a ServingSpec in, plain Kubernetes dicts out.

vLLM's OpenAI server runs on one single-host TPU slice a replica, tensor parallel over its chips,
serving a version the served run has published (trainer.hf.publish: published/<run name>/<version>/
in the artifacts bucket, by the run's name, not its hash: a rebuilt trainer image changes nothing
served until the run publishes); which one, `pulumi up` decides (workloads.deploy.ServingDeployment).
With none there are no replicas, so no TPU node is up while the run trains. A new version rolls out
one replica at a time, the new pod taking traffic only once ready.

The version is read through a read-only GCS FUSE mount of its folder alone (only-dir), with a file
cache the size of the export, parallel downloads and unbounded metadata caches, as gcsfuse's TPU
serving sample sets them; the pods act as a Google account that may only read that bucket. The first
start compiles for minutes to tens of minutes: the start-up probe allows for it, and the compiled
programs go to a writable volume (VLLM_XLA_CACHE_PATH, tpu-inference's JAX compilation cache).

A ClusterIP Service on port 8000 (nothing public), a PodMonitoring for Managed Prometheus, an
optional HorizontalPodAutoscaler on waiting requests, and a smoke Job for each served version (a
small python image, not vLLM's) that sends one chat request to the version itself: the server answers
to the run's name and to <run>@<version> (version_model), and only the new version's pods know the
second, so an old pod still serving during the rollout, or a new one that never gets ready, answers
nothing and the Job goes on asking.
"""

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from infra.catalog.names import NODE_POOL_LABEL
from infra.cloud.accounts import service_account_object
from infra.config import StackConfig
from infra.config.serving import SERVING_NAME, SERVING_POOL, SERVING_TAINT, SHM_GIB, mirrored_image, serving_account_id
from infra.config.slices import CAPACITY_SELECTORS
from infra.errors import ConfigError
from trainer.contract import PUBLISHED_MODEL_DIR, holds_parts, published_version_parts
from workloads.pods import CONTAINER_SECURITY, SKIP_AWAIT, fuse_volume, object_labels, object_metadata, pod_metadata, pod_security
from workloads.spec import RunSpec

SERVING_PORT = 8000
SERVER_CONTAINER = "vllm"
SMOKE_CONTAINER = "chat"
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
CHAT_PATH = "/v1/chat/completions"
MODEL_MOUNT = "/model"  # the served version: hf/ (merged), or base/ and adapter/
XLA_CACHE_MOUNT = "/xla-cache"
# vLLM's own metric of queue depth; Managed Prometheus names it so for the Custom Metrics adapter.
QUEUE_METRIC = "prometheus.googleapis.com|vllm:num_requests_waiting|gauge"
# Weights through FUSE and the first XLA compile of every shape vLLM serves: tens of minutes for the
# larger models. Past this the kubelet restarts the container (whose XLA cache then helps).
STARTUP_SECONDS = 60 * 60
_PROBE_PERIOD_SECONDS = 30
_XLA_CACHE_GIB = 20
_ROOT = 0  # the vLLM image runs as root (its caches live under /root); every capability is dropped
_SMOKE_UID = 65534  # nobody: the smoke Job needs no user of its own
# How long `pulumi up` waits for the smoke Job's answer when a version is published: the pool's node
# coming up, then the start-up. The Job itself waits as long as it takes.
SMOKE_AWAIT_SECONDS = STARTUP_SECONDS + 30 * 60
_SMOKE_PROMPT = "Say hello in one short sentence."
# A published version never changes: cache its metadata for good, and its files whole on first read,
# each fetched in parallel chunks (gcsfuse's config keys; GoogleCloudPlatform/gcs-fuse-csi-driver
# samples/gke-csi-yaml/tpu/serving-pv.yaml and GKE's "Optimize Cloud Storage FUSE CSI driver
# performance" set the same for serving). The file cache's size is the spec's.
_VERSION_MOUNT_OPTIONS = (
    "metadata-cache:ttl-secs:-1",
    "metadata-cache:stat-cache-max-size-mb:-1",
    "metadata-cache:type-cache-max-size-mb:-1",
    "file-cache:cache-file-for-range-read:true",
    "file-cache:enable-parallel-downloads:true",
)
# The file cache's volume: the CSI driver puts the cache of every volume of the pod in the volume of
# this name, which must sit beside them.
FUSE_CACHE_VOLUME = "gke-gcsfuse-cache"
# The sidecar's own container bounds on Standard clusters: "0" lifts the limit (GKE's documented
# value; Autopilot takes the driver's defaults, it sizes nodes from requests), so the parallel
# downloads may use the host's cores and memory; the requests keep the scheduler honest.
_SIDECAR_LIMITS = {"gke-gcsfuse/cpu-limit": "0", "gke-gcsfuse/memory-limit": "0", "gke-gcsfuse/ephemeral-storage-limit": "0",
                   "gke-gcsfuse/cpu-request": "1", "gke-gcsfuse/memory-request": "1Gi"}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class ServingSpec:
    namespace: str
    service_account: str
    google_service_account: str  # reads the artifacts bucket, nothing else
    image: str
    smoke_image: str  # not vLLM's: the Job sends one request
    served_model: str  # the name clients ask for: the run's name in the stack file
    artifacts_bucket: str
    published_dir: str  # published/<run name>, relative to the artifacts bucket (RunSpec.publish_dir)
    served_version: str | None  # the newest complete version there; None: none published yet, no replicas
    parts: tuple[str, ...]  # what the version holds: hf (merged), or base and adapter
    file_cache_mib: int  # the export's size and headroom
    file_cache_in_memory: bool  # on a RAM disk where the node's memory holds it beside vLLM, else on its boot disk
    sidecar_unbounded: bool  # the GCS FUSE sidecar without CPU, memory and disk limits (Standard clusters)
    adapter_rank: int | None  # vLLM's --max-lora-rank when serving the base with the run's adapter
    chips: int  # google.com/tpu of each replica, and the tensor-parallel size
    node_selector: dict[str, str]
    replicas: int
    max_replicas: int
    queue_depth: int | None
    max_model_len: int

    @property
    def serving(self) -> bool:
        """Whether a version is published to serve: until then the Deployment has no replicas."""
        return self.served_version is not None

    @property
    def replica_count(self) -> int:
        return self.replicas if self.serving else 0

    @property
    def file_cache_gib(self) -> int:
        return math.ceil(self.file_cache_mib / 1024)

    @property
    def version_dir(self) -> str:
        return f"{self.published_dir}/{self.served_version}"

    @property
    def smoke_name(self) -> str:
        """The smoke Job's name, one for each served version: a new version is a new Job, which asks again."""
        if not self.serving:
            return f"{SERVING_NAME}-smoke"
        return f"{SERVING_NAME}-smoke-{hashlib.sha256(self.served_version.encode()).hexdigest()[:8]}"

    @property
    def version_model(self) -> str:
        """The served model's name that only the served version's pods answer to (the smoke Job asks it)."""
        return f"{self.served_model}@{self.served_version}"

    @property
    def model_path(self) -> str:
        return f"{MODEL_MOUNT}/{'base' if self.adapter_rank else PUBLISHED_MODEL_DIR}"

    @property
    def adapter_path(self) -> str:
        return f"{MODEL_MOUNT}/adapter"

    @property
    def url(self) -> str:
        return f"http://{SERVING_NAME}.{self.namespace}.svc:{SERVING_PORT}"


def check_served_version(config: StackConfig, served_version: str) -> None:
    """The parts rule for a version named, not chosen by its marker (`render --served-version`): its name
    says what it holds (trainer.contract.published_version_parts), which must be what the serving serves. A
    name from before versions named their parts cannot be checked; `pulumi up` goes by its marker."""
    if config.serving is None:
        raise ConfigError(f"--served-version {served_version}: the stack has no gemma-tpu:serving to serve it")
    held = published_version_parts(served_version)
    if held is not None and not holds_parts(held, config.serving.parts):
        mode = "adapter" if config.serving.lora_rank else "merged"
        raise ConfigError(f"--served-version {served_version}: it holds {' and '.join(held)}, and gemma-tpu:serving.lora "
                          f"{mode} serves {' and '.join(config.serving.parts)}; name a version that holds them")


def serving_spec(config: StackConfig, run: RunSpec, served_version: str | None) -> ServingSpec:
    """The serving of `run` (the RunSpec of config.serving.run) at `served_version`, the newest complete
    version in its publish folder that holds what the serving serves (None: nothing published yet)."""
    serving = config.serving
    if served_version is not None:
        check_served_version(config, served_version)
    # Standard: the serving pool by name (training pods of the same shape go to theirs); Autopilot
    # provisions a node from the selectors alone.
    pool = {NODE_POOL_LABEL: SERVING_POOL} if config.cluster_mode == "standard" else {}
    return ServingSpec(
        namespace=config.namespace,
        service_account=SERVING_NAME,
        google_service_account=f"{serving_account_id(config.cluster_name)}@{config.project}.iam.gserviceaccount.com",
        image=mirrored_image(config, serving.image),
        smoke_image=mirrored_image(config, serving.smoke_image),
        served_model=serving.run,
        artifacts_bucket=config.artifacts_bucket,
        published_dir=run.publish_dir,
        served_version=served_version,
        parts=serving.parts,
        file_cache_mib=serving.file_cache_mib,
        file_cache_in_memory=serving.file_cache_in_memory,
        sidecar_unbounded=config.cluster_mode == "standard",
        adapter_rank=serving.lora_rank,
        chips=serving.slice.chips,
        node_selector={**serving.slice.node_selector, **CAPACITY_SELECTORS[serving.capacity], **pool},
        replicas=serving.replicas,
        max_replicas=serving.max_replicas,
        queue_depth=serving.queue_depth,
        max_model_len=serving.max_model_len,
    )


def _metadata(spec: ServingSpec, name: str, component: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return object_metadata(spec.namespace, name, component, annotations or {})


def _server_labels() -> dict[str, str]:
    return object_labels("serve", SERVING_NAME)


def server_args(spec: ServingSpec) -> list[str]:
    args = [
        "--host=0.0.0.0", f"--port={SERVING_PORT}",
        f"--model={spec.model_path}",
        f"--tensor-parallel-size={spec.chips}",
        f"--max-model-len={spec.max_model_len}",
    ]  # fmt: skip
    # The model answers to <run>@<version> (ServingSpec.version_model: the smoke Job asks it) and to <run>;
    # vLLM names the first in its answers (some versions: in every answer), so an answer carries its version.
    names = [*([spec.version_model] if spec.serving else []), spec.served_model]
    if spec.adapter_rank is None:
        return [*args, "--served-model-name", *names]
    # The base answers as <run>-base, the run's adapter by the names above (the same files).
    return [*args, f"--served-model-name={spec.served_model}-base", "--enable-lora",
            "--lora-modules", *(f"{name}={spec.adapter_path}" for name in names),
            f"--max-lora-rank={spec.adapter_rank}", "--max-loras=1"]  # fmt: skip


def _probe(failures: int, period: int = _PROBE_PERIOD_SECONDS) -> dict[str, Any]:
    return {"httpGet": {"path": HEALTH_PATH, "port": "http"}, "periodSeconds": period, "timeoutSeconds": 10,
            "failureThreshold": failures}  # fmt: skip


def _server(spec: ServingSpec) -> dict[str, Any]:
    tpu = {"google.com/tpu": str(spec.chips)}
    disk_gib = _XLA_CACHE_GIB + (0 if spec.file_cache_in_memory else spec.file_cache_gib)  # the node's disk this pod fills
    return {
        "name": SERVER_CONTAINER,
        "image": spec.image,
        "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        "args": server_args(spec),
        "env": [{"name": "VLLM_XLA_CACHE_PATH", "value": XLA_CACHE_MOUNT}],
        "ports": [{"name": "http", "containerPort": SERVING_PORT}],
        "resources": {"requests": {**tpu, "ephemeral-storage": f"{disk_gib}Gi"}, "limits": tpu},
        "startupProbe": _probe(STARTUP_SECONDS // _PROBE_PERIOD_SECONDS),
        "readinessProbe": _probe(3, period=10),
        "livenessProbe": _probe(4),
        "volumeMounts": [
            {"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True},
            {"name": "xla-cache", "mountPath": XLA_CACHE_MOUNT},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
        "securityContext": CONTAINER_SECURITY,
    }


def _version_volume(spec: ServingSpec) -> dict[str, Any]:
    """The served version alone, read-only, cached whole (a pod without a version mounts the publish
    folder, which it never reads: it has no replicas)."""
    volume = fuse_volume("model", spec.artifacts_bucket, uid=_ROOT, read_only=True)
    attributes = volume["csi"]["volumeAttributes"]
    folder = spec.version_dir if spec.serving else spec.published_dir
    attributes["mountOptions"] = ",".join([attributes["mountOptions"], f"only-dir={folder}", *_VERSION_MOUNT_OPTIONS,
                                           f"file-cache:max-size-mb:{spec.file_cache_mib}"])  # fmt: skip
    return volume


def _file_cache_volume(spec: ServingSpec) -> dict[str, Any]:
    medium = {"medium": "Memory"} if spec.file_cache_in_memory else {}
    return {"name": FUSE_CACHE_VOLUME, "emptyDir": {**medium, "sizeLimit": f"{spec.file_cache_gib}Gi"}}


def deployment(spec: ServingSpec) -> dict[str, Any]:
    labels = _server_labels()
    metadata = pod_metadata(labels, evictable=True)
    if spec.sidecar_unbounded:
        metadata["annotations"] |= _SIDECAR_LIMITS
    pod = {
        "metadata": metadata,
        "spec": {
            "serviceAccountName": spec.service_account,
            "nodeSelector": dict(spec.node_selector),
            "tolerations": [{**SERVING_TAINT, "operator": "Equal", "effect": "NoSchedule"}],
            "securityContext": pod_security(_ROOT),
            "containers": [_server(spec)],
            "volumes": [
                _version_volume(spec),
                _file_cache_volume(spec),
                {"name": "xla-cache", "emptyDir": {"sizeLimit": f"{_XLA_CACHE_GIB}Gi"}},
                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{SHM_GIB}Gi"}},
            ],
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        # `pulumi up` does not wait for the rollout (its 10 minutes are less than a first start): the
        # smoke Job waits for the server instead.
        "metadata": _metadata(spec, SERVING_NAME, "serve", SKIP_AWAIT),
        "spec": {
            "replicas": spec.replica_count,
            "selector": {"matchLabels": dict(labels)},
            # A new version (or image) starts one more pod, on one more node (the pool holds
            # maxReplicas + 1), and the old one goes only once the new one is ready: no outage.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": pod,
        },
    }


def service(spec: ServingSpec) -> dict[str, Any]:
    """Inside the cluster only: reach it with `kubectl port-forward` (serving_commands)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, SERVING_NAME, "serve", SKIP_AWAIT),  # no endpoint until the server is up
        "spec": {
            "type": "ClusterIP",
            "selector": _server_labels(),
            "ports": [{"name": "http", "port": SERVING_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def service_account(spec: ServingSpec) -> dict[str, Any]:
    return service_account_object(spec.service_account, namespace=spec.namespace, google_service_account=spec.google_service_account)


def pod_monitoring(spec: ServingSpec) -> dict[str, Any]:
    """vLLM's Prometheus metrics, scraped by Google Cloud Managed Service for Prometheus."""
    return {
        "apiVersion": "monitoring.googleapis.com/v1",
        "kind": "PodMonitoring",
        "metadata": _metadata(spec, SERVING_NAME, "serve"),
        "spec": {
            "selector": {"matchLabels": _server_labels()},
            "endpoints": [{"port": "http", "path": METRICS_PATH, "interval": "30s"}],
        },
    }


def autoscaler(spec: ServingSpec) -> dict[str, Any]:
    """Replicas between gemma-tpu:serving.replicas and autoscaling.maxReplicas on waiting requests
    (needs the Custom Metrics Stackdriver Adapter in the cluster, docs/serving.md). It leaves a
    Deployment at zero replicas (nothing published yet) at zero."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(spec, SERVING_NAME, "serve"),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": SERVING_NAME},
            "minReplicas": spec.replicas,
            "maxReplicas": spec.max_replicas,
            "metrics": [{
                "type": "Pods",
                "pods": {"metric": {"name": QUEUE_METRIC}, "target": {"type": "AverageValue", "averageValue": str(spec.queue_depth)}},
            }],
        },
    }  # fmt: skip


def chat_request(spec: ServingSpec, model: str | None = None) -> dict[str, Any]:
    """One chat request for `model` (default: the run's name, as clients ask)."""
    return {"model": model or spec.served_model, "messages": [{"role": "user", "content": _SMOKE_PROMPT}], "max_tokens": 64}


def smoke_script(spec: ServingSpec) -> str:
    """Asks the served version itself (version_model) one chat request, as long as it takes: the node comes
    up and vLLM compiles, and until the new version's pod is ready nothing answers, or an old pod answers
    404 (it does not know the name). Any other refusal fails the Job. Prints the answer with the name of the
    model that gave it; vLLM applies the export's chat template."""
    return "\n".join([
        "import json, time, urllib.request",
        f"url = {spec.url!r}",
        f"body = {json.dumps(chat_request(spec, spec.version_model))!r}.encode()",
        "while True:",
        f"    request = urllib.request.Request(url + {CHAT_PATH!r}, body, {{'Content-Type': 'application/json'}})",
        "    try:",
        "        answer = json.load(urllib.request.urlopen(request, timeout=300)); break",
        "    except OSError as error:  # no server yet, or an HTTPError: 404 from a pod of another version",
        "        if getattr(error, 'code', 404) != 404: raise",
        f"        print('waiting for {spec.version_model} at', url, '-', error, flush=True); time.sleep(30)",
        "print('answer of', answer['model'] + ':', answer['choices'][0]['message']['content'])",
    ])  # fmt: skip


def smoke_job(spec: ServingSpec) -> dict[str, Any]:
    """The smoke_script's Job. Suspended while nothing is published: it would wait for a server that has no
    replicas."""
    script = smoke_script(spec)
    container = {
        "name": SMOKE_CONTAINER,
        "image": spec.smoke_image,
        "command": ["python3", "-c", script],
        "securityContext": CONTAINER_SECURITY,
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(spec, spec.smoke_name, "smoke"),
        "spec": {
            "backoffLimit": 2,
            "suspend": not spec.serving,
            "template": {
                "metadata": {"labels": object_labels("smoke", spec.smoke_name)},
                "spec": {"restartPolicy": "Never", "securityContext": pod_security(_SMOKE_UID), "containers": [container]},
            },
        },
    }


def serving_objects(spec: ServingSpec) -> list[dict[str, Any]]:
    """Every serving object in the order they are applied; no smoke Job at zero replicas. With nothing
    published the Deployment has no replicas, which the autoscaler leaves alone (Kubernetes' HPA does
    not scale a target at zero), and the smoke Job is suspended."""
    objects = [service_account(spec), deployment(spec), service(spec), pod_monitoring(spec)]
    if spec.queue_depth is not None:
        objects.append(autoscaler(spec))
    if spec.replicas:
        objects.append(smoke_job(spec))
    return objects


def serving_commands(spec: ServingSpec) -> dict[str, str]:
    """What a user runs to reach the server from their machine."""
    request = json.dumps(chat_request(spec))
    return {
        "portForward": f"kubectl port-forward -n {spec.namespace} service/{SERVING_NAME} {SERVING_PORT}:{SERVING_PORT}",
        "curl": f"curl -s localhost:{SERVING_PORT}{CHAT_PATH} -H 'Content-Type: application/json' -d '{request}'",
        "logs": f"kubectl logs -n {spec.namespace} -f deployment/{SERVING_NAME} -c {SERVER_CONTAINER}",
        "smokeLogs": f"kubectl logs -n {spec.namespace} job/{spec.smoke_name}",
    }


def stack_serving_objects(config: StackConfig, specs: tuple[RunSpec, ...], served_version: str | None) -> list[dict[str, Any]]:
    """The serving objects of a stack whose runs are `specs` (in config order), serving `served_version`
    (None: nothing published yet); none without gemma-tpu:serving."""
    if config.serving is None:
        return []
    (served,) = [spec for run, spec in zip(config.runs, specs) if run.name == config.serving.run]
    return serving_objects(serving_spec(config, served, served_version))
