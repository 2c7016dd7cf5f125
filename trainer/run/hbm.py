"""What the TPU compiler says of a program's memory: its refusal, the HBM it lets a program use, and
what a compiled program needs per chip.

The compiler refuses a program whose temporaries exceed the chip's usable HBM (RESOURCE_EXHAUSTED,
naming both figures), but compiles one whose arguments, outputs and temporaries together exceed it:
`fits` is the check of the whole, which the step's search applies after each compile.
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


def argument_bytes_per_chip(arguments) -> int:
    """What a program's arguments (arrays or shapes with shardings) take on the chip holding most of
    them, known before compiling: the compiler's `argument_size_in_bytes` less its padding of small
    arrays to the TPU's tiles, so never more than the compiler counts."""
    per_device: dict = {}
    for leaf in jax.tree.leaves(arguments):
        shard_bytes = math.prod(leaf.sharding.shard_shape(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize
        for device in leaf.sharding.device_set:
            per_device[device] = per_device.get(device, 0) + shard_bytes
    return max(per_device.values(), default=0)


def arguments_refusal(arguments, devices) -> MemoryRefusal | None:
    """The refusal no compile needs to make: arguments that alone exceed the usable HBM (a training state
    too large for its chips), which no rematerialisation or loss head can change."""
    needed, usable = argument_bytes_per_chip(arguments), usable_hbm_bytes(devices)
    return MemoryRefusal(ARGUMENTS, needed, usable) if needed > usable else None


def whole_program_refusal(compiled, devices) -> MemoryRefusal | None:
    """The refusal the compiler did not make: a compiled program that needs more than the usable HBM."""
    needed, usable = needed_bytes(compiled), usable_hbm_bytes(devices)
    return MemoryRefusal("arguments, outputs and temporaries", needed, usable) if needed > usable else None
