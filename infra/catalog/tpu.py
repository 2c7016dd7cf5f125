"""The TPU slice catalog: the single source of truth for hardware shapes.

From an accelerator and a topology it derives the GKE machine type, chips, hosts, the node labels
pods select and whether the slice spans hosts. Node pools (infra.cloud.tpu_pools) and workloads both read
it, so a pool and the pods scheduled on it can never disagree.

Rule (AI-Hypercomputer/xpk system_characteristics.py): a 1x1 slice has one chip on one host, every
other slice has 4 chips per host. v6e 2x4 therefore means two ct6e-standard-4t hosts (the
single-host ct6e-standard-8t shape of the same topology is not offered for training: one label, one
meaning). Serving is the exception (`serving_slice`): vLLM runs on one host, and an 8-chip host of
topology 2x4 (ct6e-standard-8t, ct5lp-hightpu-8t) is GKE's largest single-host shape for it; its pool is
tainted for serving only (infra.config.serving), so a training pod of the same labels never lands there.
"""

from dataclasses import dataclass
from math import prod

from infra.errors import ConfigError

_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
# Host memory of each TPU machine type (GKE's "choose a TPU version" table, cloud.google.com/
# kubernetes-engine/docs/concepts/plan-tpus, and cloud.google.com/tpu/docs/v6e, /v5e, /v5p), read
# as GB, the smaller unit, where the sources differ in it. GKE keeps part of it from pods (node
# allocatable, cloud.google.com/kubernetes-engine/docs/concepts/plan-node-sizes): 25% of the first
# 4 GiB, 20% of the next 4, 10% of the next 8, 6% of the next 112, 2% above 128 GiB, plus the
# kubelet's 100 MiB eviction threshold. The trainer's limit leaves TRAINER_MEMORY_HEADROOM_GIB of
# that to the GCS FUSE sidecar and the node's daemons.
_GKE_MEMORY_RESERVED = ((4, 0.25), (4, 0.20), (8, 0.10), (112, 0.06), (float("inf"), 0.02))
_EVICTION_THRESHOLD_GIB = 0.1
TRAINER_MEMORY_HEADROOM_GIB = 8
_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"


@dataclass(frozen=True, kw_only=True)
class _Family:
    gke_accelerator: str
    machine_prefix: str  # machine type = f"{machine_prefix}-{chips_per_host}t"
    topologies: tuple[str, ...]
    host_memory_gb: dict[int, int]  # chips per host -> the machine type's memory, GB as Google lists it
    eight_chip_host: str | None = None  # the topology of the family's single-host 8-chip machine, if any


_FAMILIES: dict[str, _Family] = {
    "v6e": _Family(
        gke_accelerator="tpu-v6e-slice",
        machine_prefix="ct6e-standard",
        topologies=("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
        host_memory_gb={1: 448, 4: 720, 8: 1440},
        eight_chip_host="2x4",
    ),
    "v5e": _Family(
        gke_accelerator="tpu-v5-lite-podslice",
        machine_prefix="ct5lp-hightpu",
        topologies=("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
        host_memory_gb={1: 48, 4: 192, 8: 384},
        eight_chip_host="2x4",
    ),
    "v5p": _Family(
        gke_accelerator="tpu-v5p-slice",
        machine_prefix="ct5p-hightpu",
        topologies=("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4"),
        host_memory_gb={4: 448},
    ),
}

ACCELERATORS: tuple[str, ...] = tuple(_FAMILIES)


@dataclass(frozen=True, kw_only=True)
class SliceSpec:
    """One TPU slice: what its node pool provisions and what its pods must select and request."""

    accelerator: str  # "v6e" | "v5e" | "v5p"
    topology: str  # "2x4"
    gke_accelerator: str  # node label value, e.g. "tpu-v6e-slice"
    machine_type: str  # "ct6e-standard-4t"
    chips: int
    chips_per_host: int  # also the pod's `google.com/tpu` request
    hosts: int  # chips // chips_per_host
    host_memory_gb: int  # the machine type's memory

    @property
    def trainer_memory_gib(self) -> int:
        """The training container's memory limit (and request) on one host: what GKE leaves to
        pods, less the headroom. Past it the kernel OOM-kills the trainer (exit 137: the run
        fails, counted) before the node runs short and the kubelet evicts it with DisruptionTarget,
        which a run restarts from without counting, again and again."""
        left = self.host_memory_gb * 1e9 / 2**30
        reserved = 0.0
        for size, share in _GKE_MEMORY_RESERVED:
            reserved += min(left, size) * share
            left -= min(left, size)
        allocatable = self.host_memory_gb * 1e9 / 2**30 - reserved - _EVICTION_THRESHOLD_GIB
        return int(allocatable) - TRAINER_MEMORY_HEADROOM_GIB

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    @property
    def node_selector(self) -> dict[str, str]:
        return {_ACCELERATOR_LABEL: self.gke_accelerator, _TOPOLOGY_LABEL: self.topology}


def topologies(accelerator: str) -> tuple[str, ...]:
    """The topologies the catalog offers for `accelerator`, smallest first."""
    return _family(accelerator).topologies


def slice_spec(accelerator: str, topology: str) -> SliceSpec:
    """The slice for `accelerator` + `topology`; ConfigError naming the valid values otherwise."""
    family = _family(accelerator)
    if topology not in family.topologies:
        raise ConfigError(
            f"topology {topology!r} is not a {accelerator} slice; choose one of {', '.join(family.topologies)}"
        )
    chips = prod(int(side) for side in topology.split("x"))
    return _spec(accelerator, topology, chips_per_host=1 if chips == 1 else 4)


def serving_slice(accelerator: str, topology: str) -> SliceSpec:
    """The single-host slice vLLM serves from: the catalog's own where it is single-host, the family's
    8-chip host for its topology; ConfigError naming the choices for a shape no one host holds."""
    spec = slice_spec(accelerator, topology)
    if not spec.multi_host:
        return spec
    if topology == _family(accelerator).eight_chip_host:
        return _spec(accelerator, topology, chips_per_host=spec.chips)
    choices = ", ".join(s.topology for s in serving_slices(accelerator))
    raise ConfigError(f"{accelerator} {topology} spans {spec.hosts} hosts, and vLLM serves from one; choose one of {choices}")


def serving_slices(accelerator: str) -> tuple[SliceSpec, ...]:
    """Every single-host slice of `accelerator`, smallest first."""
    family = _family(accelerator)
    shapes = [t for t in family.topologies if not slice_spec(accelerator, t).multi_host or t == family.eight_chip_host]
    return tuple(serving_slice(accelerator, t) for t in shapes)


def _spec(accelerator: str, topology: str, *, chips_per_host: int) -> SliceSpec:
    family = _family(accelerator)
    chips = prod(int(side) for side in topology.split("x"))
    return SliceSpec(
        accelerator=accelerator,
        topology=topology,
        gke_accelerator=family.gke_accelerator,
        machine_type=f"{family.machine_prefix}-{chips_per_host}t",
        chips=chips,
        chips_per_host=chips_per_host,
        hosts=chips // chips_per_host,
        host_memory_gb=family.host_memory_gb[chips_per_host],
    )


def catalog() -> tuple[SliceSpec, ...]:
    """Every slice the project supports (for docs, messages and tests)."""
    return tuple(slice_spec(a, t) for a in ACCELERATORS for t in topologies(a))


def _family(accelerator: str) -> _Family:
    try:
        return _FAMILIES[accelerator]
    except KeyError:
        raise ConfigError(
            f"accelerator {accelerator!r} is not supported; choose one of {', '.join(ACCELERATORS)}"
        ) from None
