"""Every path a run reads or writes, local or gs://, through one layer: a gs:// path is checked before any
work (`check_reachable`), and storage failing on a path then or later (`reading`, `writing`) is one
UserError line naming the path, the cause (credentials, a missing bucket, the network) and the fix.

gs:// goes through etils.epath on gcsfs, as in the trainer image, also where TensorFlow is installed
(EPATH_USE_TF=0, set when this module loads): TensorFlow's file system would be a second client, with
failures of its own and a C++ log on stderr. Orbax and JAX's compilation cache read gs:// through the
same epath. gcsfs's failures are of no one type (its HttpError, aiohttp's connection errors, google.auth's,
OSError "Forbidden"), Orbax may wrap them, and gcsfs and google.auth log each failed request, some with its
traceback: Python's logging is off inside this layer, whose line says it all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pathlib
import socket
import time
from collections.abc import Iterator

from trainer.errors import UserError, first_line

os.environ.setdefault("EPATH_USE_TF", "0")  # before etils first picks a gs:// backend (it caches its choice)

READ, WRITE = "read", "write"
# A training run's paths (trainer.config.TrainConfig's fields). The inputs it reads -> what each must be (the
# words official and random are no paths); its data is local (on GKE the stacks mount the dataset's bucket).
RUN_INPUTS = {
    "weights": "official, random, a checkpoint of Gemma parameters or a Hugging Face directory",
    "lora_weights": "a PEFT LoRA adapter directory",
    "tokenizer": "the path of a SentencePiece .model file",
    "data": "a text, JSONL or Parquet file or a directory made by `python -m trainer.data.prepare`",
}
_WORDS = ("official", "random")
# The folders it writes -> (what each is for, whether it may be a gs:// path). The run's own folder and the
# local checkpoint tier are this host's (trainer.config refuses a bucket there).
RUN_FOLDERS = {
    "workdir": ("write the run in", False),
    "checkpoint_dir": ("keep checkpoints in", True),
    "local_checkpoint_dir": ("keep the local checkpoint tier in", False),
    "tensorboard_dir": ("write TensorBoard events in", True),
    "profile_dir": ("write profiles in", True),
    "compilation_cache_dir": ("keep compiled programs in", True),
    "publish_dir": ("publish versions in", True),
}
# The modules whose exceptions are storage failures, beside OSError (connection refused, timeouts, permissions).
_STORAGE_MODULES = ("aiohttp", "gcsfs", "fsspec", "google.auth", "google.api_core", "google.cloud", "requests",
                    "urllib3", "tensorflow")
_CREDENTIALS_FIX = ("give this job credentials that may {doing} it: `gcloud auth application-default login` (on GKE, a "
                    "Workload Identity binding of the pod's service account)")
_STORAGE_HOST = "storage.googleapis.com"
_NETWORK_FIX = f"check this machine's network (and proxy) to {_STORAGE_HOST}"
_UNKNOWN_FIX = ("check the network and the Google Cloud credentials (`gcloud auth application-default login`; on GKE, "
                "a Workload Identity binding of the pod's service account)")
_LOCAL_FIX = {READ: "check that this job may read it", WRITE: "choose a directory this job can write"}


@dataclasses.dataclass(frozen=True)
class Cause:
    """Why storage failed on a path, in words (empty: the failure's own line says it), and what fixes it."""

    what: str
    fix: str


_NO_ANSWER = Cause("Cloud Storage did not answer", _NETWORK_FIX)  # no network, or none to storage.googleapis.com


def is_bucket(path) -> bool:
    return str(path).startswith("gs://")


def bucket_of(path) -> str:
    return str(path).removeprefix("gs://").partition("/")[0]


def storage_failure(error: BaseException) -> BaseException | None:
    """The exception in `error`'s chain (itself, its causes) that the storage raised, if any."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) or _module_is(error, _STORAGE_MODULES):
            return error
        error = error.__cause__ or error.__context__
    return None


def _module_is(error: BaseException, names) -> bool:
    module = type(error).__module__
    return any(module == name or module.startswith(name + ".") for name in names)


def _missing_bucket(path) -> Cause | None:
    """The cause when `path`'s bucket is not there (listing it finds nothing to list: an empty bucket lists
    fine, also for an account that may not read the bucket's own metadata); None when it is, or cannot tell."""
    from etils import epath

    bucket = bucket_of(path)
    try:
        next(iter(epath.Path(f"gs://{bucket}").iterdir()), None)
    except FileNotFoundError:
        return Cause(f"there is no bucket {bucket}", f"create it (gcloud storage buckets create gs://{bucket}) or correct "
                                                     "the path")
    except Exception:  # noqa: BLE001 - any other answer: the bucket may be there
        pass
    return None


def cause_of(failure: BaseException, path, doing: str) -> Cause:
    """What a storage failure on `path` means for the user."""
    if not is_bucket(path):
        return Cause("", _LOCAL_FIX[doing])
    if getattr(failure, "code", None) in (401, 403) or _module_is(failure, ("google.auth",)) \
            or str(failure).startswith("Forbidden"):
        return Cause("Cloud Storage refused the credentials", _CREDENTIALS_FIX.format(doing=doing))
    if isinstance(failure, (ConnectionError, TimeoutError)) or _module_is(failure, ("aiohttp",)) \
            or type(failure).__name__ in ("ConnectionError", "ConnectTimeout", "ReadTimeout"):
        return _NO_ANSWER
    if isinstance(failure, FileNotFoundError):
        missing = _missing_bucket(path)
        if missing is not None:
            return missing
    return Cause("", _UNKNOWN_FIX)


def failure_line(flag: str, path, cause: Cause, *, doing: str, detail: str = "", instead: str = "") -> str:
    """`{flag} {path}: cannot {doing} it: {cause} ({detail}); {fix}, or {instead}`, the parts that are there (a
    positional argument has no flag)."""
    reason = ": ".join(part for part in (f"cannot {doing} it", cause.what) if part)
    if detail:
        reason += f" ({detail})"
    return f"{flag} {path}".lstrip() + f": {reason}; {cause.fix}" + (f", or {instead}" if instead else "")


def _detail(failure: BaseException, path) -> str:
    """The failure's own words: for a local path, an OSError's reason without the absolute path it repeats."""
    if not is_bucket(path) and isinstance(failure, OSError) and failure.strerror:
        return failure.strerror
    return first_line(failure)


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Python's logging off for the block: the storage libraries log each failed request, some with its
    traceback, from loggers of many names (gcsfs, google.auth._default, ...), some made on first use."""
    was = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(was)


@contextlib.contextmanager
def _one_line(flag: str, path, *, doing: str, instead: str) -> Iterator[None]:
    """Runs the block that uses `path`; a storage failure in it becomes the UserError of `failure_line`. A
    UserError, and any exception that is no storage failure (a bug), passes as it is."""
    with quiet_libraries():
        try:
            yield
        except UserError:
            raise
        except Exception as error:
            failure = storage_failure(error)
            if failure is None:
                raise
            raise UserError(failure_line(flag, path, cause_of(failure, path, doing), doing=doing, detail=_detail(failure, path),
                                         instead=instead)) from None


def reading(flag: str, path, *, instead: str = ""):
    """The block reads `path` (`flag` names it to the user): its storage failure is one line."""
    return _one_line(flag, path, doing=READ, instead=instead)


def writing(flag: str, path, *, instead: str = ""):
    """The block writes under `path`: its storage failure is one line."""
    return _one_line(flag, path, doing=WRITE, instead=instead)


def check_reachable(flag: str, path, *, doing: str = READ, instead: str = "") -> None:
    """Before any work: a gs:// `path` that storage cannot serve (no credentials, no network, no such bucket) is
    one line. A path not there yet is fine (a checkpoint directory, or an input whose own check says so); a
    local path is its user's to check."""
    if not is_bucket(path):
        return
    from etils import epath

    unresolved = _storage_name_unresolved()
    if unresolved:
        raise UserError(failure_line(flag, path, _NO_ANSWER, doing=doing, detail=unresolved, instead=instead))
    with _one_line(flag, path, doing=doing, instead=instead):
        if epath.Path(path).exists():
            return
        missing = _missing_bucket(path)
    if missing is not None:
        raise UserError(failure_line(flag, path, missing, doing=doing, instead=instead))


def _storage_name_unresolved(tries: int = 2) -> str:
    """Why this machine cannot look up Cloud Storage's name (no network), or "" when it can, or when gs:// does
    not go there by name (an emulator's endpoint, a proxy that resolves names itself, a file system other than
    gcsfs serving gs://). gcsfs would first spend ~50 s on retries."""
    import fsspec

    if any(os.environ.get(name) for name in ("STORAGE_EMULATOR_HOST", "HTTPS_PROXY", "https_proxy")) \
            or not fsspec.get_filesystem_class("gs").__module__.startswith("gcsfs"):
        return ""
    failure = ""
    for attempt in range(tries):
        if attempt:
            time.sleep(1.0)  # a resolver that failed once may answer the second time
        try:
            socket.getaddrinfo(_STORAGE_HOST, 443)
            return ""
        except OSError as error:
            failure = f"{_STORAGE_HOST}: {error.strerror or error}"
    return failure


def check_folder(flag: str, path, *, to: str, buckets: bool = True) -> None:
    """Before any work, a folder the run writes in (`to`: what for): not empty (the current folder, unasked), on
    gs:// reachable, locally a folder or one that can be made (nothing on its way a file) in a folder this
    job may write in. `buckets`: whether a gs:// path may be given."""
    if not str(path).strip():
        raise UserError(f"{flag} {path!r}: empty; give a folder{' or a gs:// path' if buckets else ''} to {to}")
    if is_bucket(path):
        check_reachable(flag, path, doing=WRITE)
        return
    folder = pathlib.Path(path)
    with writing(flag, path):
        existing = next(place for place in (folder, *folder.parents) if place.exists())  # "." or "/" at the latest
    if not existing.is_dir():
        raise UserError(f"{flag} {path}: {existing} is a file, not a folder; choose a folder to {to}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path}: this job may not write in {existing}; choose a folder to {to}")


def check_input(flag: str, path, *, what: str) -> None:
    """Before any work, a path the run reads (`what`: what it must be): not empty, on gs:// reachable, locally
    there (what it holds is its reader's to check)."""
    if not str(path).strip():
        raise UserError(f"{flag} {path!r}: empty; pass {what}")
    if is_bucket(path):
        check_reachable(flag, path, instead="copy it to a local disk and pass that")
        return
    with reading(flag, path):
        there = pathlib.Path(path).exists()
    if not there:
        raise UserError(f"{flag} {path}: not found; pass {what}")


def check_run_paths(config) -> None:
    """Before a training run's first work (data preparation, a compile, a file in its folders): every path of
    `config` (a trainer.config.TrainConfig), by RUN_INPUTS and RUN_FOLDERS."""
    if config.data is not None and is_bucket(config.data):
        raise UserError(f"--data {config.data}: the data is a local file or folder (on GKE the stacks mount the "
                        "dataset's bucket); copy it to a local disk, or prepare it with python -m trainer.data.prepare")
    for field, what in RUN_INPUTS.items():
        if getattr(config, field) not in (None, *_WORDS):
            check_input(_flag(field), getattr(config, field), what=what)
    for field, (to, buckets) in RUN_FOLDERS.items():
        if getattr(config, field) is not None:
            check_folder(_flag(field), getattr(config, field), to=to, buckets=buckets)


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")
