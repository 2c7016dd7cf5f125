"""bench.device_side's `--training auto`: of the full fine-tunes (float32, lean, lean-factored), the fastest the
compiler fits, by the compiled step's bound, not the first.

The rule is --remat auto's (trainer.run.step.compile_run_step): each candidate is compiled (not run) at the first
batch that fits, leanest state last, and compared by the tokens a step over its bound (the larger of its FLOPs at
the chip's peak, its HBM bytes at the chip's bandwidth, its collectives' bytes): batches differ between trainings,
so the step time alone does not rank them. A leaner state moves fewer bytes, not fewer FLOPs: no further candidate
is compiled once the fastest so far is bound by FLOPs or collectives with the least recomputation (a leaner state can
still leave room for less recomputation), nor once the time left cannot cover another compile and the chosen one's
measurement. Only the chosen one is measured. Without a chip's figures (the CPU) there is no bound, and the first that
fits is taken, as the words say. The tokens are positions, padding included: every candidate runs the same data, so
they rank the candidates as the useful tokens would.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable

from bench.side import Side
from trainer.run.step import RematSpeed

# A measured step has taken up to about 1.5x its bound on a v5e chip (bench.device's measured_over_bound): twice that,
# and a reserve for building the state, the result and the process's exit, is what a measurement is given.
MEASURED_OVER_BOUND = 3.0
MEASUREMENT_RESERVE_S = 30.0


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A full fine-tune compiled at the first batch that fits, with its bound; `side` holds the compiled step."""

    training: str
    side: Side
    tokens_per_step: int
    speed: RematSpeed | None  # None: no chip's figures (the CPU)
    compile_s: float  # its compiles, the batches refused before it included
    batches_refused: tuple[int, ...] = ()  # by the compiler, before the batch that fits

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.speed.seconds

    def figures(self) -> dict:
        return {"training": self.training, "batch": self.side.batch_size, "compile_s": self.compile_s,
                **({"tokens_per_s_bound": self.tokens_per_s, "bound_s": self.speed.seconds, "bound_by": self.speed.bound_by,
                    "remat": self.speed.remat} if self.speed else {})}


@dataclasses.dataclass(frozen=True)
class Choice:
    chosen: Candidate | None  # None: no full fine-tune fits
    others: tuple[Candidate, ...] = ()  # compiled and compared, then let go: fastest first
    not_compiled: str | None = None  # which were not, and why

    def words(self) -> str:
        """`--training auto took lean-factored at batch 16 (61,000 tokens/s by the compiler's bound, bound by bytes),
        over full at batch 8 (52,000, bytes)`, and what was not compiled."""
        chosen = self.chosen
        if chosen is None:
            return "--training auto: no full fine-tune fits"
        if chosen.speed is None:
            line = f"--training auto took {chosen.training} at batch {chosen.side.batch_size}, the first that fits: no chip's figures to compare them by"
        else:
            line = (f"--training auto took {chosen.training} at batch {chosen.side.batch_size} ({chosen.tokens_per_s:,.0f} tokens/s "
                    f"by the compiler's bound, bound by {chosen.speed.bound_by})")
            line += "".join(f", over {other.training} at batch {other.side.batch_size} ({other.tokens_per_s:,.0f}, {other.speed.bound_by})"
                            for other in self.others)
        return line + (f"; {self.not_compiled}" if self.not_compiled else "")

    def figures(self) -> dict:
        """The result JSON's: the words, and each candidate compared, the chosen first."""
        compared = [candidate.figures() for candidate in (self.chosen, *self.others) if candidate]
        return {"training_choice": self.words(), "trainings_compared": compared}


def choose(trainings: tuple[str, ...], compile_candidate: Callable[[str], Candidate | None], *, least_recomputation: str,
           seconds_left: Callable[[], float], measured_steps: int, log) -> Choice:
    """The fastest of `trainings` by the compiled bound. `compile_candidate(training)`: it compiled at the first batch
    that fits, or None where none does; `least_recomputation`: the first policy --remat tries; `measured_steps`: the
    steps the chosen one's measurement runs."""
    fastest, others, compiles_s = None, [], []
    for index, training in enumerate(trainings):
        if fastest is not None and (why := _why_stop(fastest, least_recomputation=least_recomputation, seconds_left=seconds_left(),
                                                     compile_s=max(compiles_s), measured_steps=measured_steps)):
            not_compiled = f"{', '.join(trainings[index:])} not compiled: {why}"
            log(f"  {not_compiled}")
            return Choice(fastest, _fastest_first(others), not_compiled)
        candidate = compile_candidate(training)
        if candidate is None:
            continue
        if candidate.speed is None:
            return Choice(candidate)
        compiles_s.append(candidate.compile_s)
        log(f"  {training} at batch {candidate.side.batch_size}: {candidate.tokens_per_s:,.0f} tokens/s by the compiler's bound "
            f"({candidate.speed.seconds * 1e3:.0f} ms a step, bound by {candidate.speed.bound_by})")
        if fastest is None or candidate.tokens_per_s > fastest.tokens_per_s:
            fastest, candidate = candidate, fastest
        if candidate is not None:
            others.append(candidate)
            candidate.side.close()
            gc.collect()  # its compiled program leaves the device
    return Choice(fastest, _fastest_first(others))


def _fastest_first(candidates: list[Candidate]) -> tuple[Candidate, ...]:
    return tuple(sorted(candidates, key=lambda candidate: -candidate.tokens_per_s))


def _why_stop(fastest: Candidate, *, least_recomputation: str, seconds_left: float, compile_s: float, measured_steps: int) -> str | None:
    """Why no further candidate is compiled, or None."""
    speed = fastest.speed
    if speed.bound_by != "bytes" and speed.remat == least_recomputation:
        return (f"{fastest.training} is bound by {speed.bound_by} with remat {speed.remat} "
                "(a leaner state moves fewer bytes, not fewer FLOPs)")
    measurement_s = measured_steps * speed.seconds * MEASURED_OVER_BOUND + MEASUREMENT_RESERVE_S
    if seconds_left < compile_s + measurement_s:
        return (f"{seconds_left:.0f} s of the time limit left, a compile took {compile_s:.0f} s and the measurement "
                f"needs about {measurement_s:.0f} s")
    return None
