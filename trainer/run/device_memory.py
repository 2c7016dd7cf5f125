"""The device's memory before step 1: what is live there, what the compiled step needs beyond it, the limit.

The compiler plans the train step with its arguments (state, frozen weights, batch) and nothing else. Any
other array the process keeps on the device, or a program's buffers, is memory the step did not plan for:
gemma3-1b lean-factored compiled at 14.70 GiB of the v5e chip's 15.75 and then ran out of memory at step 1
beside 3.7 GiB of float32 initial weights the loop still held. So the run looks once, before its first step,
on devices that say what they hold (TPU, GPU; the CPU does not), and stops with one line when the step
cannot fit beside what is there.
"""

from __future__ import annotations

import dataclasses

import jax

from trainer.errors import UserError
from trainer.run import hbm

_GIB = 2**30


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


def _bytes_on(device, arrays) -> int:
    return sum(shard.data.nbytes for array in arrays for shard in array.addressable_shards if shard.device == device)


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
    other_bytes = sorted(((f"{array.dtype.name}{list(array.shape)}", _bytes_on(device, [array])) for array in others),
                         key=lambda item: -item[1])
    on_device = _bytes_on(device, arguments)
    return BeforeFirstStep(in_use=stats[device]["bytes_in_use"], limit=stats[device]["bytes_limit"], arguments=on_device,
                           others=tuple(item for item in other_bytes if item[1]),
                           step_needs=max(0, hbm.needed_bytes(compiled) - on_device))


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


def check(footprint: BeforeFirstStep | None, config) -> None:
    """Stops the run before step 1 when the step cannot fit beside what the device holds."""
    if footprint is None or footprint.peak <= footprint.limit:
        return
    largest = ", ".join(f"{what} {_gib(size)} GiB" for what, size in footprint.others[:3])
    held = f"; the largest other arrays: {largest}" if largest else ""
    raise UserError(f"{footprint.line()}: {_gib(footprint.peak - footprint.limit)} GiB over{held}; "
                    f"{advice(config, jax.device_count())}")
