"""gemma-tpu:serving: vLLM on a TPU slice of its own, answering OpenAI-style chat requests with a
run's Hugging Face export, as the run publishes it (published/<run name>/<version>/hf). What it
builds: docs/serving.md.

vLLM refuses at start-up what these checks refuse here, before any resource exists: a max length
above the model's, a LoRA rank above its largest --max-lora-rank, a model whose weights and one
sequence of KV cache do not fit the chips. Its tensor parallelism over the slice's chips must
also divide the attention heads, which an 8-chip host does not for the 4-head models.
"""

import math
import re
from dataclasses import dataclass

from infra.catalog import tpu
from infra.catalog.tpu import SliceSpec
from infra.config.runs import RunConfig
from infra.config.sections import Section
from infra.errors import ConfigError
from trainer.contract import SERVED_PARTS
from trainer.run.hardware import DEVICE_KIND_OF_ACCELERATOR, hbm_bytes

SERVING_NAME = "vllm"  # the Deployment, its Service, PodMonitoring and Kubernetes ServiceAccount
SERVING_POOL = "tpu-serving"  # the serving slice's node pool (Standard clusters)
# The serving pool's taint, which only the serving pods tolerate: a training pod of the same slice
# shape selects the same node labels and would otherwise land on (or scale up) a serving node.
SERVING_TAINT = {"key": "gemma-tpu/serving", "value": "true"}
LORA_MODES = ("merged", "adapter")  # the run's merged export, or the base with its PEFT adapter (--enable-lora)
SERVING_CAPACITIES = ("on-demand", "spot")
# vllm/config/lora.py (vLLM 0.11, 01230b40): LoRAConfig.max_lora_rank is one of these; an adapter of a
# higher rank than --max-lora-rank is refused when it loads.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# vLLM's default --gpu-memory-utilization, also on TPU: the share of each chip's HBM it takes.
VLLM_MEMORY_SHARE = 0.9
DEFAULT_MAX_MODEL_LEN = 8192
# The smoke Job's image: python3 and nothing else, pulled through the stack's Docker Hub mirror. This
# digest is the one several public projects pin for python:3.12-alpine; it could not be checked against
# Docker Hub from here (`docker buildx imagetools inspect python:3.12-alpine` gives today's).
DEFAULT_SMOKE_IMAGE = "python:3.12-alpine@sha256:6d43704baacd1bfbe7c295d7f13079d5d8104ed33568873133f8fc69980419df"
_BF16 = 2
SHM_GIB = 16  # vLLM's worker processes share tensors through /dev/shm
# Room in the model mount's file cache beyond the export (gcsfuse also caches the small files and needs
# slack to evict nothing mid-load).
_CACHE_HEADROOM_MIB = 1024
# What vLLM's process takes in the host's memory beside the cache and the weights it loads (its own
# working set), with /dev/shm (SHM_GIB) on top.
_VLLM_HOST_GIB = 8
_DIGEST = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")


@dataclass(frozen=True, kw_only=True)
class ServedModel:
    """What vLLM sizes a Gemma 3 text model by (config.json of its export); tests tie each row to
    trainer.model.models and trainer.hf.config, which this layer does not import (gemma imports TensorFlow)."""

    params: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    max_len: int  # config.json max_position_embeddings

    def kv_bytes_per_token(self, chips: int) -> int:
        """K and V of one token on one chip, bfloat16, all layers: heads are split over the chips,
        and replicated where there are fewer than chips."""
        return 2 * self.layers * math.ceil(self.kv_heads / chips) * self.head_dim * _BF16

    @property
    def export_bytes(self) -> int:
        """The size of its bfloat16 Hugging Face export, near enough (the safetensors' weights)."""
        return _BF16 * self.params

    def bytes_per_chip(self, chips: int, max_len: int) -> int:
        """The bfloat16 weights split over `chips`, plus the KV cache of one sequence of `max_len`
        tokens (what vLLM needs room for before it starts)."""
        return math.ceil(_BF16 * self.params / chips) + self.kv_bytes_per_token(chips) * max_len


SERVED_MODELS = {
    "gemma3-270m": ServedModel(params=268_098_176, layers=18, heads=4, kv_heads=1, head_dim=256, max_len=32_768),
    "gemma3-1b": ServedModel(params=999_885_952, layers=26, heads=4, kv_heads=1, head_dim=256, max_len=32_768),
    "gemma3-4b": ServedModel(params=3_880_099_328, layers=34, heads=8, kv_heads=4, head_dim=256, max_len=131_072),
    "gemma3-12b": ServedModel(params=11_765_788_416, layers=48, heads=16, kv_heads=8, head_dim=256, max_len=131_072),
    "gemma3-27b": ServedModel(params=27_009_002_240, layers=62, heads=32, kv_heads=16, head_dim=128, max_len=131_072),
}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class ServingConfig:
    """The vLLM Deployment of one run's export and the TPU slice each of its replicas runs on."""

    run: str  # the run (gemma-tpu:runs name, or training.runName) whose export is served
    image: str  # the vLLM TPU image, pinned by digest
    smoke_image: str  # a small image with python3 that sends the smoke request, pinned by digest
    export_bytes: int  # the served model's export, which the model mount's file cache holds
    slice: SliceSpec  # one single-host slice a replica; tensor parallel over its chips
    capacity: str  # on-demand | spot
    replicas: int  # 0: nothing runs and the serving pool sits at zero nodes
    max_replicas: int  # the HorizontalPodAutoscaler's bound; = replicas without autoscaling
    queue_depth: int | None  # waiting requests a replica before the autoscaler adds one; None: no autoscaler
    max_model_len: int
    lora_rank: int | None  # the base with the run's adapter: vLLM's --max-lora-rank; None: the merged export

    @property
    def autoscaled(self) -> bool:
        return self.queue_depth is not None

    @property
    def parts(self) -> tuple[str, ...]:
        """What a version must hold to be served, and what the served run publishes (--publish-parts)."""
        return SERVED_PARTS["adapter" if self.lora_rank else "merged"]

    @property
    def file_cache_mib(self) -> int:
        """The model mount's file cache: the export and headroom."""
        return math.ceil(self.export_bytes / 2**20) + _CACHE_HEADROOM_MIB

    @property
    def file_cache_in_memory(self) -> bool:
        """The file cache on a RAM disk where the node's memory for pods (less the sidecar's headroom)
        holds it beside vLLM (the fastest, as GKE's guide advises), else on the node's boot disk."""
        needs_gib = self.file_cache_mib / 1024 + self.export_bytes / 2**30 + _VLLM_HOST_GIB + SHM_GIB
        return needs_gib <= self.slice.trainer_memory_gib


@dataclass(frozen=True, kw_only=True)
class _Request:
    """The section's keys, read and typed before any key of the stack is checked against another."""

    enabled: bool
    run: str
    image: str
    smoke_image: str
    accelerator: str
    topology: str
    capacity: str
    replicas: int
    max_replicas: int | None
    queue_depth: int | None
    max_model_len: int | None
    lora: str


def read_serving(section: Section, accelerator: str) -> _Request:
    autoscaling = section.section("autoscaling")
    request = _Request(
        enabled=section.flag("enabled", False),
        run=section.text("run", ""),
        image=section.text("image", ""),
        smoke_image=section.text("smokeImage", DEFAULT_SMOKE_IMAGE),
        accelerator=section.text("accelerator", accelerator, tpu.ACCELERATORS),
        topology=section.text("topology", "1x1"),
        capacity=section.text("capacity", "on-demand", SERVING_CAPACITIES),
        replicas=section.integer("replicas", 1, minimum=0),
        max_replicas=autoscaling.integer("maxReplicas", None, minimum=1),
        queue_depth=autoscaling.integer("queueDepth", None, minimum=1),
        max_model_len=section.integer("maxModelLen", None, minimum=16),
        lora=section.text("lora", LORA_MODES[0], LORA_MODES),
    )
    autoscaling.reject_unknown()
    return request


def check_serving(section: Section, request: _Request, runs: tuple[RunConfig, ...]) -> ServingConfig | None:
    """None when serving is off; otherwise the checked config, or the one-line ConfigError."""
    if not request.enabled:
        return None
    run = _served_run(section, request.run, runs)
    model = SERVED_MODELS[run.training.model]
    slice_spec = _serving_slice(section, request)
    max_model_len = request.max_model_len or min(DEFAULT_MAX_MODEL_LEN, model.max_len)
    if not _DIGEST.match(request.image):
        raise ConfigError(
            f"{section.key('image')} {request.image!r} is not pinned by digest; give the vLLM TPU image as "
            "vllm/vllm-tpu:TAG@sha256:DIGEST (docs/serving.md: `docker buildx imagetools inspect vllm/vllm-tpu:TAG`)"
        )
    if not _DIGEST.match(request.smoke_image):
        raise ConfigError(
            f"{section.key('smokeImage')} {request.smoke_image!r} is not pinned by digest; give a small image with python3 "
            "as NAME:TAG@sha256:DIGEST (`docker buildx imagetools inspect python:3.12-alpine`)"
        )
    if max_model_len > model.max_len:
        raise ConfigError(
            f"{section.key('maxModelLen')} is {max_model_len}, above {run.training.model}'s {model.max_len} "
            f"(max_position_embeddings of its export); set at most {model.max_len}"
        )
    _check_heads(section, run.training.model, model, slice_spec)
    _check_fits(section, run.training.model, model, slice_spec, max_model_len)
    return ServingConfig(
        run=run.name,
        image=request.image,
        smoke_image=request.smoke_image,
        export_bytes=model.export_bytes,
        slice=slice_spec,
        capacity=request.capacity,
        replicas=request.replicas,
        max_replicas=_max_replicas(section, request),
        queue_depth=request.queue_depth,
        max_model_len=max_model_len,
        lora_rank=_lora_rank(section, request.lora, run),
    )


def _served_run(section: Section, name: str, runs: tuple[RunConfig, ...]) -> RunConfig:
    """The run named, or by default the stack's last (newest) run."""
    if not name:
        return runs[-1]
    for run in runs:
        if run.name == name:
            return run
    raise ConfigError(
        f"{section.key('run')} is {name!r}, which is no run of this stack; choose one of {', '.join(r.name for r in runs)}"
    )


def _serving_slice(section: Section, request: _Request) -> SliceSpec:
    """vLLM on TPU in GKE runs on one host: a single-host slice (infra.catalog.tpu.serving_slice)."""
    try:
        tpu.slice_spec(request.accelerator, request.topology)
    except ConfigError as error:
        raise ConfigError(f"{section.key('topology')}: {error}") from None
    try:
        return tpu.serving_slice(request.accelerator, request.topology)
    except ConfigError as error:
        raise ConfigError(f"{section.key('topology')} {error}") from None


def _check_heads(section: Section, model_name: str, model: ServedModel, slice_spec: SliceSpec) -> None:
    """vLLM splits the attention heads over the chips (tensor parallel) and refuses a split that does
    not divide them (vllm/config/model.py verify_with_parallel_config)."""
    if model.heads % slice_spec.chips == 0:
        return
    dividing = [s.topology for s in tpu.serving_slices(slice_spec.accelerator) if model.heads % s.chips == 0]
    raise ConfigError(
        f"{section.key('topology')} {slice_spec.accelerator} {slice_spec.topology}: vLLM splits {model_name}'s {model.heads} "
        f"attention heads over the slice's {slice_spec.chips} chips, which does not divide them; choose {' or '.join(dividing)}"
    )


def _check_fits(section: Section, model_name: str, model: ServedModel, slice_spec: SliceSpec, max_model_len: int) -> None:
    usable = VLLM_MEMORY_SHARE * hbm_bytes(DEVICE_KIND_OF_ACCELERATOR[slice_spec.accelerator])
    needs = model.bytes_per_chip(slice_spec.chips, max_model_len)
    if needs <= usable:
        return
    larger = [s.topology for s in tpu.serving_slices(slice_spec.accelerator) if model.bytes_per_chip(s.chips, max_model_len) <= usable]
    fix = f"choose {' or '.join(larger)}" if larger else f"no single-host {slice_spec.accelerator} slice holds it"
    raise ConfigError(
        f"{section.key('topology')} {slice_spec.accelerator} {slice_spec.topology} cannot hold {model_name}: its bfloat16 "
        f"weights and one {max_model_len}-token sequence need {needs / 2**30:.1f} GiB a chip, and vLLM uses "
        f"{usable / 2**30:.1f} GiB of each; {fix}, or lower {section.key('maxModelLen')}"
    )


def _lora_rank(section: Section, lora: str, run: RunConfig) -> int | None:
    """vLLM's --max-lora-rank for the run's adapter: the smallest it accepts that holds the rank."""
    if lora == "merged":
        return None
    rank = run.training.lora_rank
    if not rank:
        raise ConfigError(
            f"{section.key('lora')} is adapter, but run {run.name!r} is a full fine-tune (loraRank 0) and has no "
            "adapter; use lora: merged"
        )
    allowed = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not allowed:
        raise ConfigError(
            f"{section.key('lora')} is adapter, but run {run.name!r} has loraRank {rank} and vLLM serves adapters of "
            f"rank at most {VLLM_LORA_RANKS[-1]}; use lora: merged (the run's export has the adapter merged in)"
        )
    return allowed[0]


def _max_replicas(section: Section, request: _Request) -> int:
    autoscaling = f"{section.key('autoscaling')}"
    if (request.max_replicas is None) != (request.queue_depth is None):
        raise ConfigError(f"{autoscaling} needs both maxReplicas and queueDepth (waiting requests a replica); set both or neither")
    if request.max_replicas is None:
        return request.replicas
    if request.replicas == 0:
        raise ConfigError(
            f"{autoscaling} is set but {section.key('replicas')} is 0: the autoscaler scales from at least one "
            "replica; set replicas to 1 or more, or remove autoscaling"
        )
    if request.max_replicas < request.replicas:
        raise ConfigError(
            f"{autoscaling}.maxReplicas is {request.max_replicas}, below {section.key('replicas')} {request.replicas}; "
            f"set it to at least {request.replicas}"
        )
    return request.max_replicas



def docker_hub_path(image: str) -> str | None:
    """The image's path on Docker Hub (`vllm/vllm-tpu:TAG@sha256:...`), None for another registry's
    image: its first part names a host (a dot, a port or localhost) other than docker.io."""
    first, _, rest = image.partition("/")
    if first == "docker.io":
        image, (first, _, rest) = rest, rest.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return None
    return image if rest else f"library/{image}"


def mirrored_image(config, image: str) -> str:
    """`image`, through the remote repository of `config` (the StackConfig) when it is a Docker Hub image."""
    path = docker_hub_path(image)
    if path is None:
        return image
    return f"{config.region}-docker.pkg.dev/{config.project}/{mirror_repository_id(config.cluster_name)}/{path}"


def mirror_repository_id(cluster_name: str) -> str:
    """The stack's Artifact Registry remote repository of Docker Hub, which the nodes pull a Docker
    Hub image through: in the cluster's region, read with the registry's own role."""
    return f"{cluster_name}-dockerhub"


def serving_account_id(cluster_name: str) -> str:
    """The serving pods' Google service account: as long as the training one, so within STACK_NAME_MAX."""
    return f"{cluster_name}-serve"


def metrics_adapter_account_id(cluster_name: str) -> str:
    """The Google service account the autoscaler's metrics adapter reads Cloud Monitoring as: no
    longer than the training one, so within STACK_NAME_MAX."""
    return f"{cluster_name}-hpa"
