"""What the TPU compiler says of a program's memory: its refusal, the HBM it lets a program use, and
what a compiled program needs per chip.

The compiler refuses a program whose temporaries exceed the chip's usable HBM (RESOURCE_EXHAUSTED,
naming both figures), but compiles one whose arguments, outputs and temporaries together exceed it:
`fits` is the check of the whole, which the step's search applies after each compile.

The compiler plans the train step with its arguments (state, frozen weights, batch) and nothing else: any
other array the process keeps on the device is memory the step did not plan for (gemma3-1b lean-factored
compiled at 14.70 GiB of the v5e chip's 15.75, then ran out of memory at step 1 beside 3.7 GiB of float32
initial weights the loop still held). So a run also looks at the device once before its first step
(`before_first_step`, `check_before_first_step`), where the device says what it holds (TPU, GPU; not the CPU).
"""

from __future__ import annotations

import dataclasses
import math
import re

import jax
import jax.numpy as jnp

from trainer.errors import UserError
from trainer.run import compile_answers

_GIB = 2**30


@dataclasses.dataclass(eq=False)  # not frozen: raising sets __traceback__ (a with-block that re-raises it)
class MemoryRefusal(UserError):
    """The compiler's verdict on a program that does not fit: `required` bytes of `what` per chip exceed
    the `available` HBM. A run that meets it stops with this one line."""

    what: str
    required: int
    available: int

    def __str__(self) -> str:
        return (f"the train step does not fit: its {self.what} need {self.required / _GIB:.2f} GiB per chip, the TPU compiler "
                f"allows {self.available / _GIB:.2f} GiB; lower --batch-size or --seq-len, train LoRA adapters (--lora-rank), "
                "or use more chips (python -m workloads fit names the largest batch that fits)")


_REFUSAL = re.compile(r"RESOURCE_EXHAUSTED.*?required for (?P<what>.+?) \((?P<required>[\d.]+)G\) exceeds available HBM "
                      r"\((?P<available>[\d.]+)G\)", re.S)


def memory_refusal(error: Exception) -> MemoryRefusal | None:
    """The memory refusal a failed compile carries, or None when it failed for another reason."""
    match = _REFUSAL.search(str(error))
    if match is None:
        return None
    return MemoryRefusal(match["what"], int(float(match["required"]) * _GIB), int(float(match["available"]) * _GIB))


_usable_hbm: dict[str, int] = {}


def usable_hbm_bytes(devices) -> int:
    """HBM per chip that the compiler lets a program use (v6e: 31.24 GiB of 32), asked of the compiler
    itself with a program one chip cannot hold, whose refusal names it."""
    kind = devices[0].device_kind
    if kind not in _usable_hbm:
        one = jax.sharding.SingleDeviceSharding(devices[0])
        side = 2**18  # a [side, side] float32 temporary: 256 GiB, more than any chip has

        def too_large(x):
            square = x + jax.random.normal(jax.random.key(0), (side, side), jnp.float32)
            return (square @ square)[:1, :1]

        try:
            compile_answers.compile(jax.jit(too_large).lower(jax.ShapeDtypeStruct((), jnp.float32, sharding=one)),
                                    what=f"the usable HBM of a {kind} (a probe it refuses)", devices=devices[:1])
        except jax.errors.JaxRuntimeError as error:
            refusal = memory_refusal(error)
            if refusal is None:
                raise
            _usable_hbm[kind] = refusal.available
        else:
            raise RuntimeError(f"{kind}: a 256 GiB temporary compiled; cannot tell the usable HBM")
    return _usable_hbm[kind]


def needed_bytes(compiled) -> int:
    """Per chip: arguments + outputs + temporaries - donated (aliased) + generated code."""
    memory = compiled.memory_analysis()
    return (memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes
            - memory.alias_size_in_bytes + memory.generated_code_size_in_bytes)


ARGUMENTS = "arguments (training state, frozen weights, batch)"  # what arguments_refusal refuses


def bytes_per_device(arrays) -> dict:
    """Device -> the bytes of `arrays` (arrays, or shapes with shardings) it holds: a shard of each on every
    device of its sharding (a replicated array whole on each)."""
    per_device: dict = {}
    for leaf in jax.tree.leaves(arrays):
        shard_bytes = math.prod(leaf.sharding.shard_shape(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize
        for device in leaf.sharding.device_set:
            per_device[device] = per_device.get(device, 0) + shard_bytes
    return per_device


def argument_bytes_per_chip(arguments) -> int:
    """What a program's arguments (arrays or shapes with shardings) take on the chip holding most of
    them, known before compiling: the compiler's `argument_size_in_bytes` less its padding of small
    arrays to the TPU's tiles, so never more than the compiler counts."""
    return max(bytes_per_device(arguments).values(), default=0)


def arguments_refusal(arguments, devices) -> MemoryRefusal | None:
    """The refusal no compile needs to make: arguments that alone exceed the usable HBM (a training state
    too large for its chips), which no rematerialisation or loss head can change."""
    needed, usable = argument_bytes_per_chip(arguments), usable_hbm_bytes(devices)
    return MemoryRefusal(ARGUMENTS, needed, usable) if needed > usable else None


def whole_program_refusal(compiled, devices) -> MemoryRefusal | None:
    """The refusal the compiler did not make: a compiled program that needs more than the usable HBM."""
    needed, usable = needed_bytes(compiled), usable_hbm_bytes(devices)
    return MemoryRefusal("arguments, outputs and temporaries", needed, usable) if needed > usable else None


def _gib(n: int) -> str:
    return f"{n / _GIB:.2f}"


@dataclasses.dataclass(frozen=True)
class BeforeFirstStep:
    """Bytes on the fullest local device: `in_use` by the device's count, `arguments` of them the step's state
    and frozen weights, `others` the other live arrays there ((description, bytes), largest first), and
    `step_needs` what the step's program adds (its batch, outputs and temporaries, less what it donates)."""

    in_use: int
    limit: int
    arguments: int
    others: tuple[tuple[str, int], ...]
    step_needs: int

    @property
    def peak(self) -> int:
        return self.in_use + self.step_needs

    @property
    def unplanned(self) -> int:
        """What the device holds beside the step's arguments: other arrays, programs, the allocator's own."""
        return max(0, self.in_use - self.arguments)

    def figures(self) -> dict:
        """The run's config.json record: bytes in use before step 1, of them the step's arguments, what the step
        adds, the peak that makes, and the device's limit."""
        return {"in_use_bytes": self.in_use, "arguments_bytes": self.arguments, "step_needs_bytes": self.step_needs,
                "peak_bytes": self.peak, "limit_bytes": self.limit}

    def line(self) -> str:
        other_arrays = sum(size for _, size in self.others)
        return (f"device memory before step 1: {_gib(self.in_use)} GiB in use (state and frozen weights {_gib(self.arguments)}, "
                f"{len(self.others)} other arrays {_gib(other_arrays)}, programs and the rest "
                f"{_gib(max(0, self.unplanned - other_arrays))}); the step needs {_gib(self.step_needs)} GiB more: "
                f"{_gib(self.peak)} of {_gib(self.limit)} GiB")


def before_first_step(compiled, state, frozen, *, memory_stats=lambda device: device.memory_stats()) -> BeforeFirstStep | None:
    """What the fullest local device holds now, beside what `compiled` (the train step) needs; None on a
    device that does not report its memory (`memory_stats(device)`: jax's figures of it)."""
    devices = jax.local_devices()
    stats = {device: memory_stats(device) for device in devices}
    if not all(stats.values()) or not all("bytes_limit" in s for s in stats.values()):
        return None
    device = max(devices, key=lambda d: stats[d]["bytes_in_use"])
    arguments = [leaf for leaf in jax.tree.leaves((state, frozen)) if isinstance(leaf, jax.Array)]
    argument_ids = {id(leaf) for leaf in arguments}
    others = [array for array in jax.live_arrays() if id(array) not in argument_ids and not array.is_deleted()]
    other_bytes = sorted(((f"{array.dtype.name}{list(array.shape)}", bytes_per_device(array).get(device, 0)) for array in others),
                         key=lambda item: -item[1])
    on_device = bytes_per_device(arguments).get(device, 0)
    return BeforeFirstStep(in_use=stats[device]["bytes_in_use"], limit=stats[device]["bytes_limit"], arguments=on_device,
                           others=tuple(item for item in other_bytes if item[1]),
                           step_needs=max(0, needed_bytes(compiled) - on_device))


def advice(config, device_count: int) -> str:
    """What can make a run's step smaller, of what applies to this run on `device_count` devices."""
    changes = ["lower --batch-size or --seq-len"]
    if config.remat != "full":
        changes.append("--remat full (recompute each block in the backward pass)")
    if not config.lora_rank:
        if config.precision != "lean-factored":
            changes.append("--precision lean-factored (about 6 bytes a trained parameter against float32's 16)")
        changes.append("train adapters only with --lora-rank")
    if device_count > 1 and config.mesh.get("fsdp", 1) < device_count:
        changes.append(f"split the state over the devices with --mesh fsdp={device_count}")
    return ", ".join(changes) + " (python -m workloads fit compiles a setting for a slice and names the largest batch that fits)"


def check_before_first_step(footprint: BeforeFirstStep | None, config) -> None:
    """Stops the run before step 1 when the step cannot fit beside what the device holds."""
    if footprint is None or footprint.peak <= footprint.limit:
        return
    largest = ", ".join(f"{what} {_gib(size)} GiB" for what, size in footprint.others[:3])
    held = f"; the largest other arrays: {largest}" if largest else ""
    raise UserError(f"{footprint.line()}: {_gib(footprint.peak - footprint.limit)} GiB over{held}; "
                    f"{advice(config, jax.device_count())}")
