"""Goodput: the share of a run's paid wall time that trained steps it kept, and where the rest went.

Pure accounting of the events trainer.measure.run_events records, every attempt's. The wall time runs
from the first attempt's start to the last event of the last one, and splits into:
  productive           each kept step's computation (goodput = productive / wall)
  TPU_INITIALIZATION   process start to the devices being up (the interpreter and imports included)
  TRAINING_PREP        inputs, model and state (the `inputs` and `weights` spans say how much each), and
                       whatever else came before the first step
  PROGRAM_STARTUP      compiling the step
  DATA_LOADING_SYNC    blocked on the next batch
  UNPRODUCTIVE_CHECKPOINT_SAVE_TIME / _RESTORE_TIME   the checkpoint time the loop waited on
  WASTED_PROGRESS_FROM_DISRUPTION   steps a later attempt computed again, at the time they took the first
                       time: an attempt's steps beyond the checkpoint the attempts after it resumed from
  INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION   between an attempt's last event and the next one's start
  OTHER                eval, samples, export, and anything no event covers
The names are ml-goodput-measurement's BadputType names (trainer.contract.BADPUT_CATEGORIES). The
categories sum to the wall time by construction: what no event explains goes to TRAINING_PREP before
the first step and to OTHER after it, and an attempt is cut where the next one starts.
"""

from __future__ import annotations

import collections
import dataclasses

from trainer.contract import BADPUT_CATEGORIES, BADPUT_KEYS, GOODPUT_KEY

PRODUCTIVE = "PRODUCTIVE_STEP_TIME"
# The category of each span event's seconds; steps split into productive or wasted, and their data wait.
SPAN_CATEGORIES = {
    "restore": "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
    "compile": "PROGRAM_STARTUP",
    "save": "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
    "eval": "OTHER",
    "export": "OTHER",
}


@dataclasses.dataclass(frozen=True)
class Breakdown:
    """Seconds by category (PRODUCTIVE and BADPUT_CATEGORIES), over `attempts` attempts."""

    seconds: dict[str, float]
    attempts: int

    @property
    def wall_s(self) -> float:
        return sum(self.seconds.values())

    @property
    def goodput(self) -> float:
        return self.seconds[PRODUCTIVE] / self.wall_s if self.wall_s > 0 else 0.0

    def shares(self) -> dict[str, float]:
        return {category: seconds / self.wall_s if self.wall_s > 0 else 0.0 for category, seconds in self.seconds.items()}

    def report(self) -> dict[str, float]:
        """The report's keys (trainer.contract): the goodput and each badput category's share."""
        shares = self.shares()
        return {GOODPUT_KEY: self.goodput} | {BADPUT_KEYS[category]: shares[category] for category in BADPUT_CATEGORIES}


def account(attempts: list[list[dict]]) -> Breakdown:
    """The breakdown of the events of a run's attempts (any order; an attempt without its start event,
    such as a file cut short before its first line, is left out)."""
    timed = sorted((_start(events), events) for events in attempts if _start(events) is not None)
    seconds = collections.Counter({category: 0.0 for category in (PRODUCTIVE, *BADPUT_CATEGORIES)})
    for index, (start, events) in enumerate(timed):
        end = max(event["time"] for event in events)
        later = timed[index + 1:]
        if later:
            next_start = later[0][0]
            end = max(min(end, next_start), start)  # an attempt ends where the next begins
            seconds["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] += next_start - end
        resumed = [event["start_step"] for _, events_after in later for event in events_after if event["event"] == "ready"]
        _attempt(events, start, end, min(resumed, default=None), seconds)
    return Breakdown(seconds=dict(seconds), attempts=len(timed))


def _start(events: list[dict]) -> float | None:
    return next((event["time"] for event in events if event["event"] == "start"), None)


def _attempt(events: list[dict], start: float, end: float, resumed_from: int | None, seconds: collections.Counter) -> None:
    """Adds the attempt's [start, end] to `seconds`: up to `init`, from there to `ready`, then the loop.
    `resumed_from`: the earliest step a later attempt resumed after (its steps beyond it were lost)."""
    init = _clamped(_first(events, "init", end), start, end)
    ready = _clamped(_first(events, "ready", end), init, end)
    seconds["TPU_INITIALIZATION"] += init - start
    before, after = collections.Counter(), collections.Counter()
    for event in events:
        into = before if event["time"] <= ready else after
        if event["event"] == "steps":
            wasted = _lost_share(event, resumed_from) * event["seconds"]
            into["WASTED_PROGRESS_FROM_DISRUPTION"] += wasted
            into[PRODUCTIVE] += event["seconds"] - wasted
            into["DATA_LOADING_SYNC"] += event["data_seconds"]
        elif event["event"] in SPAN_CATEGORIES:
            into[SPAN_CATEGORIES[event["event"]]] += event["seconds"]
    _fill(seconds, ready - init, before, rest="TRAINING_PREP")
    _fill(seconds, end - ready, after, rest="OTHER")


def _first(events: list[dict], name: str, default: float) -> float:
    return next((event["time"] for event in events if event["event"] == name), default)


def _clamped(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def _lost_share(steps: dict, resumed_from: int | None) -> float:
    """The share of a steps record's steps past `resumed_from` (a share: a record spans several steps)."""
    if resumed_from is None:
        return 0.0
    count = steps["last"] - steps["first"] + 1
    return min(max(steps["last"] - max(steps["first"] - 1, resumed_from), 0), count) / count


def _fill(seconds: collections.Counter, window: float, spans: collections.Counter, *, rest: str) -> None:
    """Adds `spans` and, for what they leave of `window`, `rest`. Spans that add up to more than the
    window (a clock step) are scaled down to it, so that the window is counted exactly once."""
    measured = sum(spans.values())
    scale = min(1.0, window / measured) if measured > 0 else 1.0
    for category, value in spans.items():
        seconds[category] += value * scale
    seconds[rest] += window - measured * scale


def format_table(breakdown: Breakdown, *, title: str) -> str:
    """The breakdown as a table: category, seconds, share of the wall time."""
    shares = breakdown.shares()
    width = max(len(category) for category in breakdown.seconds) + 2
    lines = [title, f"{'category':<{width}}{'seconds':>12}{'share':>9}"]
    for category, value in breakdown.seconds.items():
        label = f"{category} (goodput)" if category == PRODUCTIVE else category
        lines.append(f"{label:<{width}}{value:>12.2f}{shares[category]:>9.1%}")
    lines.append(f"{'wall time':<{width}}{breakdown.wall_s:>12.2f}{1 if breakdown.wall_s else 0:>9.1%}")
    return "\n".join(lines)
