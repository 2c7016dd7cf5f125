"""What each attempt of a run spent its time on, as timestamped events in WORKDIR/goodput/: one file
per attempt (a process of process index 0, a restart being a new attempt), one JSON object a line.
trainer.measure.goodput_accounting turns the events of all attempts into the goodput table.

The events, each with `time` (seconds since the epoch, when it ended):
  start    the process started (from /proc when the entry point asks for it); `run`: the run's identity
           (trainer.run_identity), so that another run's attempts in the folder are not counted as this one's
  init     the distributed system and the devices are up
  ready    inputs, model and state are prepared and the step compiled: the loop starts after `start_step`
  steps    steps `first`..`last`: `seconds` computing them, `data_seconds` blocked on their batches
           (one record per log interval, so that a long run's file stays small)
  restore, compile, save, eval, export   a span of `seconds` (restore and save name their `step`)
  inputs, weights   spans before the first step: the tokenizer and data prepared (or read back), the
           initial weights and state built (a resumed run: LoRA's frozen base only)
  end      the attempt ended; `status` is "done" or the exception that ended it
A killed process writes no `end`. Its last steps record is still current to its last step: the record of
the steps since the last flush is rewritten in place after every step, padded to a fixed width at the end of
the file (one small write, no new line), so that the steps a kill loses count as steps a later attempt
computed again, and a report of a running or killed attempt reaches its last step.

Recording must never fail a run: a write that fails warns once and recording stops.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import sys
import time

EVENTS_DIR = "goodput"
# Events that recur through the loop: the live view of the current attempt sums them into one record
# each, so that a report's accounting does not grow with the run.
RECURRING = ("steps", "save", "eval", "export")
SPAN_FIELDS = ("seconds", "data_seconds")
# The width a steps line is padded to, so that its rewrite after the next step covers it (module docstring).
STEPS_LINE_WIDTH = 256


def process_start_time() -> float:
    """When this process started, in seconds since the epoch: from /proc/self/stat (Linux), so that the
    interpreter's start and the imports count; else now."""
    try:
        fields = pathlib.Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in clock ticks
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - started_after_boot)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


# The numeric fields the accounting (trainer.measure.goodput_accounting) reads of each kind of event, beside `time`.
REQUIRED_FIELDS = {"steps": ("first", "last", "seconds", "data_seconds"), "ready": ("start_step",),
                   **{span: ("seconds",) for span in ("restore", "compile", "save", "eval", "export")}}


def _readable(event) -> bool:
    if not (isinstance(event, dict) and isinstance(event.get("event"), str)):
        return False
    numbers = ("time", *REQUIRED_FIELDS.get(event["event"], ()))
    return all(isinstance(event.get(field), (int, float)) and not isinstance(event.get(field), bool) for field in numbers)


def read_events(lines: list[str]) -> tuple[list[dict], int]:
    """(the events of one attempt's file, how many lines were left out): a line a kill left torn, one that
    is not JSON or not UTF-8, or an event without the numbers the accounting reads is skipped."""
    events, skipped = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            event = None
        if _readable(event):
            events.append(event)
        else:
            skipped += 1
    return events, skipped


def read_attempts(directory, *, run: str | None = None, warn=None) -> list[list[dict]]:
    """The events of every attempt in `directory` (a pathlib or etils.epath Path: local or gs://) of run `run`
    (an attempt that names another run is left out; one from before attempts named their run is kept). A file
    with lines that cannot be read is used without them; `warn` (default: a line on stderr) says what was left
    out, once a file: recording never fails a run, nor does reading what was recorded."""
    warn = warn or (lambda line: print(f"trainer: warning: {line}", file=sys.stderr, flush=True))
    attempts = []
    for path in sorted(directory.glob("events-*.jsonl")):
        events, skipped = read_events(path.read_bytes().decode("utf-8", errors="replace").splitlines())
        if skipped:
            warn(f"{path}: {skipped} goodput event line{'s' if skipped != 1 else ''} unreadable (not JSON, not UTF-8, "
                 "or a field missing), left out of the accounting")
        other = next((event.get("run") for event in events if event["event"] == "start"), None)
        if run is not None and other is not None and other != run:
            warn(f"{path}: the goodput events of run {other}, not of this folder's run {run}; left out of the accounting")
            continue
        attempts.append(events)
    return attempts


class EventLog:
    """The events of this attempt. Until `open` knows the run directory and whether this process
    writes, events wait in memory; a process other than process 0 records nothing. Use as a context
    manager around the attempt: its exit records `end`."""

    def __init__(self, started: float | None = None, *, clock=time.time):
        self._clock = clock
        self._path: pathlib.Path | None = None
        self._fd: int | None = None  # the file, open from the first write after a flush to the next flush
        self._written = 0  # the bytes of the file in finished lines; the current steps line follows them
        self._steps_width = STEPS_LINE_WIDTH  # of the current steps line, never narrower than its last write
        self._writing = True
        self._unwritten: list[dict] = []
        self._steps: dict | None = None  # the steps since the last flush
        self.previous: list[list[dict]] = []  # the events of the attempts before this one
        self._live: list[dict] = []  # this attempt's events, but the recurring ones after `ready`...
        self._sums: dict[str, dict] = {}  # ...which are summed here, one record a kind
        self._ready = False
        self._record({"event": "start", "time": self._clock() if started is None else started, "pid": os.getpid()})

    def open(self, workdir: pathlib.Path, *, is_main: bool, run: str | None = None) -> None:
        """Starts writing this attempt's file in `workdir`, after reading the earlier attempts' of run `run`
        (its identity, which the start event records)."""
        if not is_main:
            self._writing, self._unwritten, self._live = False, [], []
            return
        if run is not None:
            self._live[0]["run"] = run  # the start event, not written yet
        directory = workdir / EVENTS_DIR
        started = self._live[0]["time"]
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started)) + f"{started % 1:.6f}"[1:]
        path = directory / f"events-{stamp}Z-{os.getpid()}.jsonl"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self.previous = read_attempts(directory, run=run)
            self._written = path.stat().st_size if path.exists() else 0  # appended to, never overwritten
        except OSError as error:
            self._stop(directory, error)
            return
        self._path = path
        self.flush()

    def mark(self, event: str, **fields) -> None:
        self._end_steps()  # the steps before it come first in the file
        self._record({"event": event, "time": self._clock(), **fields})
        self.flush()

    @contextlib.contextmanager
    def span(self, event: str, **fields):
        """Records `event` with the seconds its block took; the block may add fields to the dict it gets."""
        began = self._clock()
        try:
            yield fields
        finally:
            end = self._clock()
            self._end_steps()
            self._record({"event": event, "time": end, "seconds": end - began, **fields})
            self.flush()

    def step(self, number: int, *, waited: float, began: float) -> None:
        """Step `number` is done: its batch was asked for at `waited`, arrived at `began`."""
        if not self._writing:
            return
        end = self._clock()
        if self._steps is None:
            self._steps = {"event": "steps", "time": end, "first": number, "last": number, "seconds": 0.0, "data_seconds": 0.0}
        self._steps.update(time=end, last=number)
        self._steps["seconds"] += end - began
        self._steps["data_seconds"] += began - waited
        if self._path is not None:
            self._write(self._line(self._steps))

    def attempts(self) -> list[list[dict]]:
        """Every attempt's events so far, this one's recurring events summed into one record each (the
        same accounting); none in a process that does not record."""
        if not self._writing:
            return []
        sums = dict(self._sums)
        if self._steps is not None:
            sums["steps"] = _summed(sums.get("steps"), self._steps)
        return [*self.previous, self._live + list(sums.values())]

    def flush(self) -> None:
        """Writes what waits, the steps since the last flush as one record (over the line that held them),
        and closes the file (on a FUSE-mounted bucket, the close uploads it)."""
        self._end_steps()
        if self._path is None or not self._unwritten:
            return
        text = "".join(self._line(event) for event in self._unwritten)
        self._unwritten = []
        if self._write(text):
            self._written += len(text.encode())
            self._steps_width = STEPS_LINE_WIDTH
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, traceback):
        self.mark("end", status="done" if exc_type is None else exc_type.__name__)

    def _end_steps(self) -> None:
        if self._steps is not None:
            self._record(self._steps)
            self._steps = None

    def _record(self, event: dict) -> None:
        if not self._writing:
            return
        self._unwritten.append(event)
        kind = event["event"]
        if kind in RECURRING and self._ready:
            self._sums[kind] = _summed(self._sums.get(kind), event)
        else:
            self._ready = self._ready or kind == "ready"
            self._live.append(event)

    def _line(self, event: dict) -> str:
        """`event` as a line; a steps line padded (JSON allows the spaces) to the width its rewrites keep."""
        line = json.dumps(event)
        if event["event"] != "steps":
            return line + "\n"
        self._steps_width = max(self._steps_width, len(line))
        return line.ljust(self._steps_width) + "\n"

    def _write(self, text: str) -> bool:
        """Writes `text` after the finished lines, in one write (a kill tears one line at most)."""
        try:
            if self._fd is None:
                self._fd = os.open(self._path, os.O_WRONLY | os.O_CREAT, 0o666)
            os.pwrite(self._fd, text.encode(), self._written)
            return True
        except OSError as error:
            self._stop(self._path, error)
            return False

    def _stop(self, where, error: OSError) -> None:
        print(f"trainer: warning: {where}: recording the run's goodput events failed ({error.strerror or error}); "
              "the run goes on without them", file=sys.stderr, flush=True)
        if self._fd is not None:
            os.close(self._fd)
        self._writing, self._path, self._fd, self._unwritten, self._live = False, None, None, [], []


def _summed(earlier: dict | None, event: dict) -> dict:
    """`event` with the seconds of `earlier` (of its kind) added: one record that spans both."""
    if earlier is None:
        return dict(event)
    summed = {**event, **{field: earlier[field] + event[field] for field in SPAN_FIELDS if field in event}}
    if "first" in earlier:
        summed["first"] = earlier["first"]
    return summed
