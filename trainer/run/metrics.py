"""Training metrics to three places: WORKDIR/metrics.jsonl, the terminal and TensorBoard.

metrics.jsonl gets one JSON object per report, appended, so a resumed run continues the file; a
value that is not finite (a diverged loss) is written as null, which every JSON reader accepts.
On a terminal the report redraws one progress line with an ETA; anywhere else it prints one plain
line per report. With `log_format="json"` (the training pods) every line it prints is one JSON object
instead (trainer.contract's marks: the record and the plain line as `message`), for Cloud Logging.
Only the main process writes anything.
"""

import json
import math
import pathlib
import shutil
import sys
import time

from trainer import contract, storage
from trainer.errors import UserError

METRICS_FILE = "metrics.jsonl"

# How each known metric reads on screen; anything else is shown with 4 significant digits.
_SCREEN_FORMATS = {
    "loss": "{:.4f}",
    "eval_loss": "{:.4f}",
    "eval_perplexity": "{:.2f}",
    "learning_rate": "{:.2e}",
    "grad_norm": "{:.3f}",
    "step_time_s": "{:.3f}",
}
_SCREEN_COUNTS = ("tokens_per_sec", "tokens_per_sec_per_device")
# Short screen names, so a report fits a terminal line; metrics.jsonl keeps the full keys.
_SCREEN_LABELS = {
    "learning_rate": "lr",
    "tokens_per_sec": "tok/s",
    "tokens_per_sec_per_device": "tok/s/dev",
    "step_time_s": "s/step",
    "eval_perplexity": "eval_ppl",
    "mfu_documents": "mfu_docs",
}
_BAR_WIDTH = 20
# Shown as percentages.
_SCREEN_SHARES = ("mfu", "mfu_documents", contract.GOODPUT_KEY)
# In the record only: the badput breakdown would crowd the line (`python -m trainer.goodput_report` prints it).
_OFF_SCREEN = frozenset(contract.BADPUT_KEYS.values())


def _json_value(value):
    """A plain JSON value from a Python, numpy or JAX scalar."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if hasattr(value, "item"):  # numpy and JAX scalars and 0-d arrays
        value = value.item()
    if isinstance(value, int):
        return value
    value = float(value)
    return value if math.isfinite(value) else None


def _human_count(value: float) -> str:
    for threshold, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= threshold:
            return f"{value / threshold:.1f}{suffix}"
    return f"{value:.0f}"


def _screen_value(key: str, value) -> str:
    if value is None:
        return "n/a"
    if key in _SCREEN_SHARES:
        return f"{100 * value:.1f}%"
    if key in _SCREEN_COUNTS:
        return _human_count(value)
    if isinstance(value, float):
        return _SCREEN_FORMATS.get(key, "{:.4g}").format(value)
    return str(value)


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}"


class MetricsReporter:
    """Reports metrics every few steps; use as a context manager so files are closed and flushed.

    `start_step` is the first step this run will report: above 0 when resuming, so that
    TensorBoard drops what an interrupted earlier run logged from that step on (the lines it
    left in metrics.jsonl stay; `trainer.measure.plot` keeps the later report of a step).
    `clock` is the time source for the ETA (injectable for tests). `log_format` is "text" or
    "json" (trainer.config.LOG_FORMATS).
    """

    def __init__(
        self,
        workdir,
        *,
        total_steps: int,
        tensorboard_dir: str | None,
        is_main_process: bool = True,
        stream=None,
        start_step: int = 0,
        clock=time.monotonic,
        log_format: str = "text",
    ):
        self._total_steps = total_steps
        # Looked up per reporter, not at import: sys.stdout may be replaced (pytest capture, redirection).
        stream = sys.stdout if stream is None else stream
        self._stream = stream
        self._clock = clock
        self._is_main_process = is_main_process
        self._json_lines = log_format == "json"
        self._is_terminal = is_main_process and not self._json_lines and bool(getattr(stream, "isatty", lambda: False)())
        self._first_report = None  # (step, time) of this run's first report: the ETA's origin
        self._bar_drawn = False
        self._jsonl = None
        self._tensorboard = None
        if not is_main_process:
            return
        path = pathlib.Path(workdir) / METRICS_FILE
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._jsonl = path.open("ab+")
        except OSError as error:
            raise UserError(f"cannot write metrics to {path}: {error.strerror}; choose a writable --workdir") from None
        self._drop_torn_line()
        if tensorboard_dir is not None:
            from tensorboardX import SummaryWriter  # only the main process pays for the import

            # tensorboardX names event files by the second: a suffix keeps a quick restart from
            # overwriting the previous run's file.
            with storage.writing("--tensorboard-dir", tensorboard_dir):
                self._tensorboard = SummaryWriter(
                    tensorboard_dir, purge_step=start_step or None, filename_suffix=f".{time.time_ns()}"
                )

    def _drop_torn_line(self) -> None:
        """Cut off a last line that a killed run left half-written, so every line stays one object."""
        self._jsonl.seek(0)
        content = self._jsonl.read()
        if content and not content.endswith(b"\n"):
            self._jsonl.truncate(content.rfind(b"\n") + 1)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def close(self) -> None:
        self._end_bar()
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None

    def report(self, step: int, metrics: dict[str, float]) -> None:
        """Record the metrics of `step`: a JSON line, a terminal line and TensorBoard scalars."""
        if not self._is_main_process:
            return
        record = {"step": step} | {key: _json_value(value) for key, value in metrics.items()}
        self._jsonl.write((json.dumps(record) + "\n").encode())  # one write: a kill tears at most this line
        self._jsonl.flush()
        if self._tensorboard is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tensorboard.add_scalar(key, value, step)
            self._tensorboard.flush()
        self._show(step, record)

    def text(self, tag: str, step: int, text: str) -> None:
        """Show a piece of text (e.g. a sample generation) on the terminal and in TensorBoard."""
        if not self._is_main_process:
            return
        self._end_bar()
        if self._json_lines:
            self._print_json({contract.LOG_EVENT_KEY: contract.TEXT_EVENT, "tag": tag, "step": step, "message": text})
        else:
            print(f"[{tag}, step {step}]\n{text}", file=self._stream, flush=True)
        if self._tensorboard is not None:
            self._tensorboard.add_text(tag, text, step)
            self._tensorboard.flush()

    def _eta(self, step: int) -> str:
        now = self._clock()
        if self._first_report is None:
            self._first_report = (step, now)
        first_step, first_time = self._first_report
        if step <= first_step:
            return "--"
        seconds_per_step = (now - first_time) / (step - first_step)
        return _duration(seconds_per_step * max(self._total_steps - step, 0))

    def _show(self, step: int, record: dict) -> None:
        fields = " ".join(
            f"{_SCREEN_LABELS.get(key, key)} {_screen_value(key, value)}" for key, value in record.items()
            if key != "step" and key not in _OFF_SCREEN
        )
        progress = f"step {step}/{self._total_steps}"
        eta = f"ETA {self._eta(step)}"
        if self._json_lines:
            self._print_json({contract.LOG_EVENT_KEY: contract.REPORT_EVENT, **record, "message": f"{progress} {fields} {eta}"})
            return
        if not self._is_terminal:
            print(f"{progress} {fields} {eta}", file=self._stream, flush=True)
            return
        done = min(max(step / self._total_steps, 0.0), 1.0) if self._total_steps else 1.0
        filled = round(done * _BAR_WIDTH)
        bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
        # A line wider than the terminal would wrap, and \r could no longer redraw it: cut it to
        # the width, the ETA first so that it is never the part cut off.
        line = f"[{bar}] {done:4.0%} {progress} {eta} | {fields}"[: shutil.get_terminal_size().columns - 1]
        # \r returns to the line start, \x1b[K clears what a longer previous line left behind.
        self._stream.write(f"\r{line}\x1b[K")
        self._stream.flush()
        self._bar_drawn = True

    def _print_json(self, line: dict) -> None:
        print(json.dumps(line), file=self._stream, flush=True)

    def _end_bar(self) -> None:
        if self._bar_drawn:
            self._stream.write("\n")
            self._stream.flush()
            self._bar_drawn = False


def read_metrics(path) -> list[dict]:
    """The JSON objects of a metrics.jsonl file, in file order (blank lines skipped)."""
    path = pathlib.Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UserError(f"metrics file {path} does not exist; it is WORKDIR/{METRICS_FILE} of a training run") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read metrics file {path}: {error}") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict) or "step" not in record:
            raise UserError(f"{path}:{number} is not a metrics record (a JSON object with a 'step')")
        records.append(record)
    return records
