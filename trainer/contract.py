"""The container's contract with the workloads that run it: its exit codes, the image's user, the
prepared-data marker and the marks of its JSON log lines. No heavy imports: the workload builders,
the image build and the stack's log-based metrics read it."""

import datetime
import json
import sys

OK = 0
# A user error (bad flag, config or data file): retrying cannot help, so the run fails at once.
USER_ERROR = 2
# The trainer checkpointed after a preemption notice (SIGTERM) and asks to be restarted.
# 75 is EX_TEMPFAIL from sysexits.h: "temporary failure, try again".
RETRY = 75

# The local checkpoint tier (trainer.run.local_checkpoints) keeps this many complete steps of each
# process, and writes the next one before it removes the oldest: the workloads size its volume from it.
LOCAL_CHECKPOINTS_KEPT = 2

# The image's non-root user (trainer/Dockerfile takes it as a build argument from infra/cloud/image.py).
TRAINER_UID = 1000
# `python -m trainer.data.prepare` writes this file last inside its output and renames the output into
# place: its presence means the prepared data is complete.
PREPARED_MARKER_FILE = "meta.json"

# `--log-format json`: each line the trainer prints on stdout is one JSON object, which GKE's logging
# agent turns into a log entry's jsonPayload. This key says what the line is: a metrics report (its
# metrics.jsonl record, plus `message`, the plain line Logs Explorer shows) or a piece of text (a
# sample generation, a note).
LOG_EVENT_KEY = "event"
REPORT_EVENT = "report"
TEXT_EVENT = "text"

# Published exports (trainer.hf.publish), which serving follows: PUBLISH_DIR/<version>/<part>, a
# version named <UTC stamp>-<run identity>.<parts> (published_version_name) so that names sort by time
# and say which run (trainer.run_identity) and what they hold. The workloads give the trainer
# --publish-dir <artifacts>/PUBLISHED_DIR/<run name>. A version is complete once its marker is there:
# written last, after every file of its parts, on any filesystem or bucket; the marker names the run and
# the parts the version holds and is the one object per version that serving lists and reads.
PUBLISHED_DIR = "published"
PUBLISHED_MODEL_DIR = "hf"
PUBLISHED_MARKER_FILE = "published.json"
PUBLISHED_STAMP_FORMAT = "%Y%m%dT%H%M%SZ"
# What a version may hold: the merged model, or the frozen base and the PEFT adapter (trainer.export).
PUBLISHED_PARTS = (PUBLISHED_MODEL_DIR, "base", "adapter")
# The parts each gemma-tpu:serving.lora mode serves: what the served run publishes (--publish-parts)
# and what a version must hold for serving to pick it.
SERVED_PARTS = {"merged": (PUBLISHED_MODEL_DIR,), "adapter": ("base", "adapter")}
_PARTS_SEPARATOR = "+"


def published_version_name(run: str, parts, now: datetime.datetime) -> str:
    """`20261205T120000Z-train-0123abcd.adapter+base`: when, which run, what it holds."""
    stamp = now.astimezone(datetime.timezone.utc).strftime(PUBLISHED_STAMP_FORMAT)
    return f"{stamp}-{run}.{_PARTS_SEPARATOR.join(sorted(set(parts)))}"


def published_version_parts(version: str) -> tuple[str, ...] | None:
    """The parts a version holds, as its name says them; None for a name that does not (a version
    published before names said their parts: its marker says them)."""
    _, dot, named = version.rpartition(".")
    parts = tuple(named.split(_PARTS_SEPARATOR)) if dot else ()
    if not parts or not set(parts) <= set(PUBLISHED_PARTS) or parts != tuple(sorted(set(parts))):
        return None
    return parts


def holds_parts(held, needed) -> bool:
    """The parts rule: a version serves what needs `needed` only when it holds every one of them."""
    return set(needed) <= set(held)


def _marker_problem(marker) -> str | None:
    if not isinstance(marker, dict):
        return f"a JSON {type(marker).__name__}, not an object"
    if not isinstance(marker.get("run"), str):
        return "no \"run\" name"
    if not (isinstance(marker.get("parts"), list) and all(isinstance(part, str) for part in marker["parts"])):
        return "\"parts\" is not a list of names"
    if type(marker.get("step", 0)) is not int:
        return "\"step\" is not a whole number"
    return None


def published_marker(text: str | None, *, source: str, warn=None) -> dict | None:
    """A version's PUBLISHED_MARKER_FILE as trainer.hf.publish writes it ({"run": str, "parts": [str], and "step":
    int where the step is known}), or None for anything else (no text, not JSON, a list, a field of another type):
    such a version is not one a run or serving may take, and `warn` (default: a line on stderr) says so once,
    naming `source`. The one reader of the marker, for the trainer and the workloads alike."""
    if text is None:
        return None
    try:
        marker = json.loads(text)
        problem = _marker_problem(marker)
    except ValueError:
        problem = "not JSON"
    if problem is None:
        return marker
    warning = f"{source}: not a version's marker ({problem}); that version is left out"
    (warn or (lambda line: print(f"warning: {line}", file=sys.stderr, flush=True)))(warning)
    return None

# Goodput (trainer.measure.goodput_accounting): every report line carries GOODPUT_KEY, the share of the run's
# paid wall time (all attempts, the gaps between them included) that trained steps kept, and one
# BADPUT_KEYS share per category of the rest. The categories are ml-goodput-measurement's BadputType
# names, so that its users can compare; the stack's log-based metrics read these keys.
GOODPUT_KEY = "goodput"
BADPUT_CATEGORIES = (
    "TPU_INITIALIZATION", "TRAINING_PREP", "PROGRAM_STARTUP", "DATA_LOADING_SYNC", "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
    "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME", "WASTED_PROGRESS_FROM_DISRUPTION", "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION", "OTHER",
)  # fmt: skip
BADPUT_KEYS = {category: f"badput_{category.lower()}" for category in BADPUT_CATEGORIES}
