"""Processes, devices and shardings: distributed init, work process 0 does first, the (data, fsdp)
mesh, FSDP rules, global batches.

Batches are split over both axes (FSDP is data parallel too); parameters and optimizer state are
replicated over `data` and, when large, split over `fsdp`. With several slices (MEGASCALE_NUM_SLICES),
`data` spans the slices over DCN and `fsdp` stays inside a slice on ICI, where
bandwidth is highest (as MaxText lays out multislice meshes).
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import math
import os
import sys
from collections.abc import Callable, Mapping
from typing import TypeVar

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trainer.config import format_mesh
from trainer.errors import UserError, entry_point, first_line
from trainer.nn.sharding import fsdp_spec

BATCH_AXES = ("data", "fsdp")
_GPU_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")
T = TypeVar("T")
# Process 0 may tokenize a multi-gigabyte --data file for a while before the others can start.
WAIT_FOR_PROCESS_ZERO_S = 2 * 3600
_DONE = "done"
_USER_ERROR = "user error: "
_CRASHED = "crashed: "


def _installed(plugin: str) -> bool:
    return importlib.util.find_spec(plugin) is not None


def tpu_chips_attached() -> int:
    """TPU chips on this machine's PCI bus (JAX's own test, read without starting libtpu), or where a
    sandbox shows no PCI bus (gVisor), the TPU device files libtpu opens (/dev/accel*, /dev/vfio/N). JAX's test
    has no public name."""
    from jax._src import hardware_utils

    return (hardware_utils.num_available_tpu_chips_and_device_id()[0] or len(glob.glob("/dev/accel[0-9]*"))
            or len(glob.glob("/dev/vfio/[0-9]*")))


def _accelerator_installed() -> bool:
    """Whether JAX will find a TPU or GPU, decided without initialising a backend (initialize must come first).
    libtpu alone is no TPU: the development environment carries it to compile for TPU (trainer.measure.compiled)."""
    if os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu":
        return False
    return (_installed("libtpu") and tpu_chips_attached() > 0) or any(_installed(name) for name in _GPU_PLUGINS)


def initialize_distributed(*, coordinator_address: str | None, num_processes: int | None, process_id: int | None) -> bool:
    """Calls jax.distributed.initialize() where it applies; returns whether it did.

    Given explicitly (flags or JAX_* env): those; `--num-processes 1` alone: one process of its own, with
    no cluster detection. On TPU/GPU otherwise: JAX's cluster auto-detection (GKE, multislice), so that
    even one host gets the preemption service that turns SIGTERM into a sync point. Where detection finds
    no cluster or fails before reaching one (a TPU VM outside GKE whose metadata server does not answer:
    requests' ConnectionError), one process of its own, said in one line. On CPU without them: skipped,
    single process.
    """
    if num_processes == 1 and coordinator_address is None and process_id in (None, 0):
        return _initialize_alone()
    explicit = (coordinator_address, num_processes, process_id)
    if any(value is not None for value in explicit):
        if any(value is None for value in explicit):
            raise UserError("--coordinator-address, --num-processes and --process-id go together: give all three or none "
                            "(--num-processes 1 alone: one process, without cluster detection)")
        if process_id >= num_processes:
            raise UserError(f"--process-id {process_id} must be below --num-processes {num_processes}")
        jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id)
        return True
    if not _accelerator_installed():
        return False
    try:
        jax.distributed.initialize()
    except Exception as error:
        if jax.distributed.is_initialized():
            raise  # a cluster was found; joining it failed
        print(f"trainer: notice: no cluster detected ({type(error).__name__}: {first_line(error)}); training as one "
              "process on this host (--num-processes 1 skips the detection; --coordinator-address, --num-processes and "
              "--process-id join a cluster)", file=sys.stderr, flush=True)
        return _initialize_alone()
    return True


def _initialize_alone() -> bool:
    """A one-process job of its own: the preemption service without a cluster, and no detection (which on a
    TPU host asks the metadata server again). Where the host allows no local socket for its coordinator (a
    sandbox), one process without that service, said in one line; whether it started."""
    try:
        port = _free_port()
    except OSError as error:
        print(f"trainer: notice: no local socket for the preemption service ({first_line(error)}); training without it: "
              "a SIGTERM stops this run without a checkpoint", file=sys.stderr, flush=True)
        return False
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=1, process_id=0,
                               cluster_detection_method="deactivate")
    return True


def process_zero_first(what: str, make: Callable[[], T]) -> T:
    """Runs `make` on process 0 first, then on every other process, and returns its result.

    `make` creates whatever of `what` is missing (each file atomically, trainer.shared_files) and
    opens it. On a shared workdir the others then only read what process 0 made; on a host-local
    one each makes its own.
    A UserError of process 0 is raised, with its message, in every process, so that all of them
    fail with the same line instead of waiting for a peer that is gone.
    """
    if jax.process_count() == 1 or not jax.distributed.is_initialized():
        return make()
    import orbax.checkpoint as ocp  # only with several processes

    # JAX's distributed runtime client (the coordination service's key-value store), as Orbax reaches it: a
    # wait that is not a device collective, so it has a timeout of its own and carries a message.
    client = ocp.multihost.get_jax_distributed_client()
    key = f"gemma-tpu/process-zero-first/{what}"
    if jax.process_index() == 0:
        try:
            result = make()
        except UserError as error:
            client.key_value_set(key, f"{_USER_ERROR}{error}", allow_overwrite=True)
            raise
        except BaseException as error:
            client.key_value_set(key, f"{_CRASHED}{type(error).__name__}", allow_overwrite=True)
            raise
        client.key_value_set(key, _DONE, allow_overwrite=True)
        return result
    try:
        word = client.blocking_key_value_get(key, WAIT_FOR_PROCESS_ZERO_S * 1000)
    except jax.errors.JaxRuntimeError as error:
        raise RuntimeError(f"waited for process 0 to make {what}: {first_line(error)}") from None
    if word.startswith(_USER_ERROR):
        raise UserError(word.removeprefix(_USER_ERROR))
    if word.startswith(_CRASHED):
        raise RuntimeError(f"process 0 failed to make {what} ({word.removeprefix(_CRASHED)}); its log has the traceback")
    return make()


def require_requested_platform() -> None:
    """With JAX_PLATFORMS set, a backend that does not start is one clear error. Without it JAX
    falls back to the host CPU with a warning, and a TPU pod would train on its CPU for hours; the
    TPU pods set JAX_PLATFORMS=tpu (workloads.spec). Unset, on a machine with libtpu but no TPU chip
    (the development environment), JAX is kept off the TPU backend, whose start-up only prints warnings."""
    requested = os.environ.get("JAX_PLATFORMS", "").strip()
    if not requested:
        if _installed("libtpu") and not tpu_chips_attached() and not any(_installed(name) for name in _GPU_PLUGINS):
            jax.config.update("jax_platforms", "cpu")
        return
    reason = None
    if "tpu" in requested.lower().split(",") and not tpu_chips_attached():
        reason = "no TPU chip is attached to this machine"
    else:
        try:
            jax.devices()
        except RuntimeError as error:
            reason = str(error).split(" (set JAX_PLATFORMS")[0]
    if reason:
        raise UserError(
            f"environment variable JAX_PLATFORMS={requested}: that backend did not start ({reason}); on a GKE TPU "
            "node the pod must request google.com/tpu and its user must be able to open the TPU device files "
            "(docs/workloads.md, 'Non-root pods and the TPU'); unset JAX_PLATFORMS to let JAX choose"
        ) from None


def jax_entry_point(prefix: str = ""):
    """errors.entry_point for a CLI `main` that starts JAX: require_requested_platform runs first, so every
    such command picks its backend alike, and a backend that does not start is one line and exit 2."""

    def decorate(main):
        @entry_point(prefix)
        @functools.wraps(main)
        def run(*args, **kwargs):
            require_requested_platform()
            return main(*args, **kwargs)

        return run

    return decorate


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def num_slices() -> int:
    """Slices of a multislice job; the workload sets MEGASCALE_NUM_SLICES from the TPU catalog."""
    text = os.environ.get("MEGASCALE_NUM_SLICES", "1")
    try:
        return max(1, int(text))
    except ValueError:
        raise UserError(f"environment variable MEGASCALE_NUM_SLICES: expected an integer, got {text!r}") from None


def resolve_axis_sizes(requested: Mapping[str, int], device_count: int) -> dict[str, int]:
    """Fills the -1 axis so that the sizes multiply to `device_count`."""
    fixed = math.prod(size for size in requested.values() if size != -1)
    sizes = dict(requested)
    for axis, size in requested.items():
        if size == -1:
            if device_count % fixed:
                raise UserError(f"--mesh {format_mesh(requested)}: {device_count} devices do not divide by {fixed}")
            sizes[axis] = device_count // fixed
    if math.prod(sizes.values()) != device_count:
        raise UserError(f"--mesh {format_mesh(requested)}: needs {math.prod(sizes.values())} devices, this job has {device_count}")
    return sizes


def build_mesh(requested: Mapping[str, int], *, slices: int = 1, devices=None) -> Mesh:
    devices = list(jax.devices() if devices is None else devices)
    sizes = resolve_axis_sizes(requested, len(devices))
    shape = tuple(sizes[axis] for axis in BATCH_AXES)
    if slices == 1:
        return Mesh(mesh_utils.create_device_mesh(shape, devices), BATCH_AXES)
    # TPU devices know their slice. Elsewhere (CPU tests emulating slices) every device reports slice 0,
    # so each process stands for one slice.
    process_is_granule = devices[0].platform != "tpu"
    processes = len({device.process_index for device in devices})
    if process_is_granule and processes != slices:
        raise UserError(
            f"environment variable MEGASCALE_NUM_SLICES={slices}: off TPU each process emulates one slice, "
            f"this job has {processes} processes"
        )
    if sizes["data"] % slices:
        raise UserError(f"--mesh {format_mesh(sizes)}: the data axis must be a multiple of the {slices} slices")
    ici_shape = (sizes["data"] // slices, sizes["fsdp"])
    dcn_shape = (slices, 1)
    device_array = mesh_utils.create_hybrid_device_mesh(ici_shape, dcn_shape, devices, process_is_granule=process_is_granule)
    return Mesh(device_array, BATCH_AXES)


def check_batch(batch_size: int, mesh: Mesh, *, grad_accum_steps: int = 1) -> None:
    """--batch-size must split evenly over the mesh's devices and the processes (hosts) that hold them, and with
    --grad-accum-steps so must each micro-batch over the devices (every one runs its share of every micro-batch)."""
    processes = len({device.process_index for device in mesh.devices.flat})
    for divisor, what in ((mesh.size, f"the {mesh.size} devices"), (processes, f"the {processes} processes")):
        if batch_size % divisor:
            raise UserError(f"--batch-size {batch_size} must be a multiple of {what}")
    micro_batch = batch_size // grad_accum_steps
    if batch_size % grad_accum_steps or micro_batch % mesh.size:
        fewer = [steps for steps in range(grad_accum_steps - 1, 0, -1) if batch_size % (steps * mesh.size) == 0][0]
        raise UserError(f"--batch-size {batch_size} as --grad-accum-steps {grad_accum_steps} micro-batches of "
                        f"{batch_size / grad_accum_steps:g} rows: a micro-batch must be a multiple of the {mesh.size} devices; "
                        f"give a --batch-size that is a multiple of {grad_accum_steps * mesh.size}, or --grad-accum-steps {fewer}")


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def state_shardings(mesh: Mesh, tree):
    """NamedShardings for a tree of arrays (or ShapeDtypeStructs): params, optimizer state alike."""
    fsdp_size = mesh.shape["fsdp"]
    return jax.tree.map(lambda leaf: NamedSharding(mesh, fsdp_spec(tuple(leaf.shape), fsdp_size)), tree)


def global_batch(local_batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """This process's rows -> global arrays; each process holds its own (different) rows."""
    sharding = batch_sharding(mesh)
    rows = next(iter(local_batch.values())).shape[0] * jax.process_count()
    return {
        key: jax.make_array_from_process_local_data(sharding, value, (rows, *value.shape[1:]))
        for key, value in local_batch.items()
    }
