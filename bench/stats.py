"""Summaries the benchmarks print: medians and spreads of repeats, per-side throughput, process memory."""

from __future__ import annotations

import dataclasses
import resource
import statistics


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def spread(values: list[float]) -> float:
    """(max - min) / median: how far apart the repeats were."""
    return (max(values) - min(values)) / statistics.median(values)


def mib(n_bytes: int | None) -> str:
    return "n/a" if n_bytes is None else f"{n_bytes / 2**20:,.0f} MiB"


@dataclasses.dataclass
class Repeats:
    """Timed repeats of one side: each is `steps` steps, dispatched back to back and waited for at the end."""

    seconds: list[float] = dataclasses.field(default_factory=list)
    useful_tokens: list[int] = dataclasses.field(default_factory=list)
    positions: list[int] = dataclasses.field(default_factory=list)
    steps: list[int] = dataclasses.field(default_factory=list)

    def add(self, seconds: float, useful_tokens: int, positions: int, steps: int) -> None:
        self.seconds.append(seconds)
        self.useful_tokens.append(useful_tokens)
        self.positions.append(positions)
        self.steps.append(steps)

    @property
    def step_times(self) -> list[float]:
        return [s / n for s, n in zip(self.seconds, self.steps)]

    @property
    def useful_tokens_per_sec(self) -> float:
        """Over all repeats together (total tokens over total time)."""
        return sum(self.useful_tokens) / sum(self.seconds)

    @property
    def positions_per_sec(self) -> float:
        return sum(self.positions) / sum(self.seconds)

    @property
    def padding_fraction(self) -> float:
        return 1 - sum(self.useful_tokens) / sum(self.positions)
