"""What the throughput benchmark needs of each side: compile, step, wait, and the compiled step's memory."""

from __future__ import annotations

import abc
import dataclasses
import time

import jax


@dataclasses.dataclass(frozen=True)
class StepCounts:
    useful_tokens: int  # loss-bearing positions of the batch (not padding)
    positions: int  # all positions computed, padding included


class Side(abc.ABC):
    """One way of training; `compile()` first, then `step()` as often as needed."""

    name: str
    batch_size: int  # global, in rows

    def __init__(self):
        self._compiled = None
        self._last = None
        self.compile_s: float | None = None

    @abc.abstractmethod
    def _build(self):
        """The jit step compiled for this side's batches (jax.stages.Compiled)."""

    @abc.abstractmethod
    def _dispatch(self, compiled) -> tuple[StepCounts, object]:
        """Builds the next batch, dispatches one step without waiting; returns its counts and an output to wait on."""

    def compile(self) -> None:
        """Compiles the step ahead of time (once), timing it apart from the steps."""
        if self._compiled is not None:
            return
        start = time.perf_counter()
        self._compiled = self._build()
        self.compile_s = time.perf_counter() - start

    def step(self) -> StepCounts:
        counts, self._last = self._dispatch(self._compiled)
        return counts

    def wait(self) -> None:
        jax.block_until_ready(self._last)

    def last_output(self):
        """What the last step returned beside the state (ours: its metrics, the loss among them)."""
        return self._last

    def truncated_fraction(self) -> float:
        """Share of the documents' tokens this side has dropped rather than trained on."""
        return 0.0

    def step_choices(self) -> dict:
        """What the side's step was compiled with, where it chose (ours: remat policy, vocabulary chunk)."""
        return {}

    def close(self) -> None:
        """Stops background work (a loader's prefetch thread)."""

    def memory_analysis(self):
        """XLA's memory figures of the compiled step (jax CompiledMemoryStats), or None where unsupported."""
        return self._compiled.memory_analysis()

    def hlo_text(self) -> str:
        """The compiled step's optimized HLO (what a profile's operations are named by)."""
        return self._compiled.as_text()

    def cost_analysis(self) -> dict:
        """XLA's cost figures of the compiled step ("flops", "bytes accessed", ...); {} where unsupported."""
        costs = self._compiled.cost_analysis()
        return (costs[0] if isinstance(costs, list) else costs) or {}

    def step_memory_bytes(self) -> int | None:
        """XLA's figure for the compiled step: arguments + outputs (less donated aliases) + temporaries."""
        analysis = self.memory_analysis()
        if analysis is None:
            return None
        return (analysis.argument_size_in_bytes + analysis.output_size_in_bytes - analysis.alias_size_in_bytes
                + analysis.temp_size_in_bytes)
