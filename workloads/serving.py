"""Pure builders of the serving objects (gemma-tpu:serving): a ServingSpec in, plain Kubernetes dicts out.

vLLM's OpenAI server runs on one single-host TPU slice a replica, tensor parallel over its chips,
reading the served run's export from the artifacts bucket through a read-only GCS FUSE mount of that
export alone (only-dir). Its pods act as a Google account that may only read that bucket. An init
container waits until the export's config.json is there (the run may still be training) and says
so in its log. The first start compiles for minutes to tens of minutes: the start-up probe allows
for it, and the compiled programs go to a writable volume (VLLM_XLA_CACHE_PATH, which tpu-inference
hands to JAX as its compilation cache), so a restarted container does not compile again.

A ClusterIP Service on port 8000 (nothing public), a PodMonitoring for Managed Prometheus, an
optional HorizontalPodAutoscaler on waiting requests, and a smoke Job that waits for the server and
sends it one chat request.
"""

import json
from dataclasses import dataclass
from typing import Any

from infra.cloud.accounts import service_account_object
from infra.config import StackConfig
from infra.config.serving import SERVING_NAME, SERVING_POOL, SERVING_TAINT, docker_hub_path, mirror_repository_id, serving_account_id
from infra.config.slices import CAPACITY_SELECTORS
from infra.catalog.names import NODE_POOL_LABEL
from workloads.manifests import CONTAINER_SECURITY, SKIP_AWAIT, fuse_volume, object_labels, pod_metadata, pod_security
from workloads.spec import RunSpec

SERVING_PORT = 8000
SERVER_CONTAINER = "vllm"
WAIT_CONTAINER = "wait-for-export"
SMOKE_CONTAINER = "chat"
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
CHAT_PATH = "/v1/chat/completions"
MODEL_MOUNT = "/model"  # the run's export directory: hf/ (merged), or base/ and adapter/
XLA_CACHE_MOUNT = "/xla-cache"
# vLLM's own metric of queue depth; Managed Prometheus names it so for the Custom Metrics adapter.
QUEUE_METRIC = "prometheus.googleapis.com|vllm:num_requests_waiting|gauge"
# Weights through FUSE and the first XLA compile of every shape vLLM serves: tens of minutes for the
# larger models. Past this the kubelet restarts the container (whose XLA cache then helps).
STARTUP_SECONDS = 60 * 60
_PROBE_PERIOD_SECONDS = 30
_XLA_CACHE_GIB = 20
_SHM = "16Gi"  # vLLM's worker processes share tensors through /dev/shm
_ROOT = 0  # the vLLM image runs as root (its caches live under /root); every capability is dropped
_WAIT_LOG_SECONDS = 60
# How long `pulumi up` waits for the smoke Job's answer when the export is there: the pool's node
# coming up, then the start-up. The Job itself waits as long as it takes.
SMOKE_AWAIT_SECONDS = STARTUP_SECONDS + 30 * 60
_SMOKE_PROMPT = "Say hello in one short sentence."
# The export's folder is read-only and never changes once written: cache its metadata for good, but
# not a lookup that found nothing, so the wait sees config.json appear (gcsfuse
# samples/gke-csi-yaml/tpu/serving-pv.yaml sets the same two).
_EXPORT_MOUNT_OPTIONS = ("metadata-cache:ttl-secs:-1", "metadata-cache:negative-ttl-secs:0")


@dataclass(frozen=True, kw_only=True)
class ServingSpec:
    namespace: str
    service_account: str
    google_service_account: str  # reads the artifacts bucket, nothing else
    image: str
    served_model: str  # the name clients ask for: the run's name in the stack file
    artifacts_bucket: str
    export_dir: str  # runs/<run object>/export, relative to the artifacts bucket
    adapter_rank: int | None  # vLLM's --max-lora-rank when serving the base with the run's adapter
    chips: int  # google.com/tpu of each replica, and the tensor-parallel size
    node_selector: dict[str, str]
    replicas: int
    max_replicas: int
    queue_depth: int | None
    max_model_len: int

    @property
    def model_path(self) -> str:
        return f"{MODEL_MOUNT}/{'base' if self.adapter_rank else 'hf'}"

    @property
    def adapter_path(self) -> str:
        return f"{MODEL_MOUNT}/adapter"

    @property
    def awaited_files(self) -> tuple[str, ...]:
        """What the export writes last (each directory is renamed into place whole)."""
        files = (f"{self.model_path}/config.json",)
        return (*files, f"{self.adapter_path}/adapter_config.json") if self.adapter_rank else files

    @property
    def awaited_objects(self) -> tuple[str, ...]:
        """The same files as objects of the artifacts bucket."""
        return tuple(f"{self.export_dir}{path.removeprefix(MODEL_MOUNT)}" for path in self.awaited_files)

    @property
    def url(self) -> str:
        return f"http://{SERVING_NAME}.{self.namespace}.svc:{SERVING_PORT}"


def served_image(config: StackConfig) -> str:
    """gemma-tpu:serving.image, through the stack's remote repository when it is a Docker Hub image."""
    path = docker_hub_path(config.serving.image)
    if path is None:
        return config.serving.image
    return f"{config.region}-docker.pkg.dev/{config.project}/{mirror_repository_id(config.cluster_name)}/{path}"


def serving_spec(config: StackConfig, run: RunSpec) -> ServingSpec:
    """The serving of `run` (the RunSpec of config.serving.run)."""
    serving = config.serving
    # Standard: the serving pool by name (training pods of the same shape go to theirs); Autopilot
    # provisions a node from the selectors alone.
    pool = {NODE_POOL_LABEL: SERVING_POOL} if config.cluster_mode == "standard" else {}
    return ServingSpec(
        namespace=config.namespace,
        service_account=SERVING_NAME,
        google_service_account=f"{serving_account_id(config.cluster_name)}@{config.project}.iam.gserviceaccount.com",
        image=served_image(config),
        served_model=serving.run,
        artifacts_bucket=config.artifacts_bucket,
        export_dir=f"{run.run_dir}/export",
        adapter_rank=serving.lora_rank,
        chips=serving.slice.chips,
        node_selector={**serving.slice.node_selector, **CAPACITY_SELECTORS[serving.capacity], **pool},
        replicas=serving.replicas,
        max_replicas=serving.max_replicas,
        queue_depth=serving.queue_depth,
        max_model_len=serving.max_model_len,
    )


def _metadata(spec: ServingSpec, name: str, component: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    metadata = {"name": name, "namespace": spec.namespace, "labels": object_labels(component, name)}
    return metadata | {"annotations": annotations} if annotations else metadata


def _server_labels() -> dict[str, str]:
    return object_labels("serve", SERVING_NAME)


def server_args(spec: ServingSpec) -> list[str]:
    args = [
        "--host=0.0.0.0", f"--port={SERVING_PORT}",
        f"--model={spec.model_path}",
        f"--tensor-parallel-size={spec.chips}",
        f"--max-model-len={spec.max_model_len}",
    ]  # fmt: skip
    if spec.adapter_rank is None:
        return [*args, f"--served-model-name={spec.served_model}"]
    # The base answers as <run>-base, the run's adapter as <run>.
    return [*args, f"--served-model-name={spec.served_model}-base", "--enable-lora",
            f"--lora-modules={spec.served_model}={spec.adapter_path}", f"--max-lora-rank={spec.adapter_rank}",
            "--max-loras=1"]  # fmt: skip


def _wait_for_export(spec: ServingSpec) -> dict[str, Any]:
    """Waits as long as it takes (the run may train for hours), saying every minute what for."""
    files = " ".join(spec.awaited_files)
    bucket_paths = ", ".join(f"gs://{spec.artifacts_bucket}/{name}" for name in spec.awaited_objects)
    script = (
        f"for f in {files}; do until [ -f \"$f\" ]; do "
        f"echo \"waiting for $f ({bucket_paths}): the run's export is not written yet\"; sleep {_WAIT_LOG_SECONDS}; "
        f"done; done; echo \"found {files}: starting vLLM\""
    )
    return {
        "name": WAIT_CONTAINER,
        "image": spec.image,
        "command": ["sh", "-c", script],
        "volumeMounts": [{"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}],
        "securityContext": CONTAINER_SECURITY,
    }


def _probe(failures: int, period: int = _PROBE_PERIOD_SECONDS) -> dict[str, Any]:
    return {"httpGet": {"path": HEALTH_PATH, "port": "http"}, "periodSeconds": period, "timeoutSeconds": 10,
            "failureThreshold": failures}  # fmt: skip


def _server(spec: ServingSpec) -> dict[str, Any]:
    tpu = {"google.com/tpu": str(spec.chips)}
    return {
        "name": SERVER_CONTAINER,
        "image": spec.image,
        "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        "args": server_args(spec),
        "env": [{"name": "VLLM_XLA_CACHE_PATH", "value": XLA_CACHE_MOUNT}],
        "ports": [{"name": "http", "containerPort": SERVING_PORT}],
        "resources": {"requests": {**tpu, "ephemeral-storage": f"{_XLA_CACHE_GIB}Gi"}, "limits": tpu},
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


def _export_volume(spec: ServingSpec) -> dict[str, Any]:
    volume = fuse_volume("model", spec.artifacts_bucket, uid=_ROOT, read_only=True)
    attributes = volume["csi"]["volumeAttributes"]
    attributes["mountOptions"] = ",".join([attributes["mountOptions"], f"only-dir={spec.export_dir}", *_EXPORT_MOUNT_OPTIONS])
    return volume


def deployment(spec: ServingSpec) -> dict[str, Any]:
    labels = _server_labels()
    pod = {
        "metadata": pod_metadata(labels, evictable=True),
        "spec": {
            "serviceAccountName": spec.service_account,
            "nodeSelector": dict(spec.node_selector),
            "tolerations": [{**SERVING_TAINT, "operator": "Equal", "effect": "NoSchedule"}],
            "securityContext": pod_security(_ROOT),
            "initContainers": [_wait_for_export(spec)],
            "containers": [_server(spec)],
            "volumes": [
                _export_volume(spec),
                {"name": "xla-cache", "emptyDir": {"sizeLimit": f"{_XLA_CACHE_GIB}Gi"}},
                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": _SHM}},
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
            "replicas": spec.replicas,
            "selector": {"matchLabels": dict(labels)},
            # One slice a replica: a rolling update brings the new pod up before the old one goes
            # only where the pool has room; with none it would wait for ever, so replace in place.
            "strategy": {"type": "Recreate"},
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
    (needs the Custom Metrics Stackdriver Adapter in the cluster, docs/serving.md)."""
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


def chat_request(spec: ServingSpec) -> dict[str, Any]:
    return {"model": spec.served_model, "messages": [{"role": "user", "content": _SMOKE_PROMPT}], "max_tokens": 64}


def smoke_job(spec: ServingSpec) -> dict[str, Any]:
    """Waits for the server to be ready, as long as it takes (the run may still be training), sends
    it one chat request (vLLM applies the export's chat template) and prints the answer."""
    script = "\n".join([
        "import json, time, urllib.request",
        f"url = {spec.url!r}",
        "while True:",
        "    try:",
        f"        urllib.request.urlopen(url + {HEALTH_PATH!r}, timeout=10); break",
        "    except OSError as error:",
        "        print('waiting for vLLM at', url, '-', error, flush=True); time.sleep(30)",
        f"body = {json.dumps(chat_request(spec))!r}.encode()",
        f"request = urllib.request.Request(url + {CHAT_PATH!r}, body, {{'Content-Type': 'application/json'}})",
        "answer = json.load(urllib.request.urlopen(request, timeout=300))",
        "print('answer:', answer['choices'][0]['message']['content'])",
    ])  # fmt: skip
    container = {
        "name": SMOKE_CONTAINER,
        "image": spec.image,
        "command": ["python3", "-c", script],
        "securityContext": CONTAINER_SECURITY,
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(spec, f"{SERVING_NAME}-smoke", "smoke"),
        "spec": {
            "backoffLimit": 2,
            "template": {
                "metadata": {"labels": object_labels("smoke", f"{SERVING_NAME}-smoke")},
                "spec": {"restartPolicy": "Never", "securityContext": pod_security(_ROOT), "containers": [container]},
            },
        },
    }


def serving_objects(spec: ServingSpec) -> list[dict[str, Any]]:
    """Every serving object in the order they are applied; no smoke Job at zero replicas."""
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
        "smokeLogs": f"kubectl logs -n {spec.namespace} job/{SERVING_NAME}-smoke",
    }


def stack_serving_objects(config: StackConfig, specs: tuple[RunSpec, ...]) -> list[dict[str, Any]]:
    """The serving objects of a stack whose runs are `specs` (in config order); none without gemma-tpu:serving."""
    if config.serving is None:
        return []
    (served,) = [spec for run, spec in zip(config.runs, specs) if run.name == config.serving.run]
    return serving_objects(serving_spec(config, served))
