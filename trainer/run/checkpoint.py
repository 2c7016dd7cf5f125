"""Orbax checkpoints of the train state together with the data iterator's position, and the final export.

One checkpoint = {"state": step, trained params, optimizer state (sharded, every process writes
its shards), "data": the grain iterator state (one file per process)}. Saves are asynchronous;
`close()` waits for the last one.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import time

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from trainer import shared_files, storage
from trainer.errors import UserError, first_line
from trainer.model import params_io
from trainer.model.params_io import absolute_path

# What Orbax and grain raise for a checkpoint they cannot read into the given tree: a tree or shape
# mismatch or damaged tensor data (ValueError), a missing item (KeyError), a missing file (OSError).
_UNREADABLE = (ValueError, KeyError, OSError)
# A read that fails is tried again after each of these delays: a FUSE or GCS hiccup passes.
RETRY_DELAYS_S = (1.0, 4.0)
# Checkpoints that do not read are set aside here (inside the checkpoint directory, where Orbax
# lists no step), never deleted: a read can fail for a reason that passes.
QUARANTINE_DIR = "quarantine"
# More unreadable checkpoints in a row than this point at the run or the storage, not at damage.
MAX_UNREADABLE_IN_A_ROW = 2


def print_warning(message: str) -> None:
    print(f"trainer: warning: {message}", file=sys.stderr, flush=True)


def _of_another_run(error: Exception | None) -> bool:
    """Whether Orbax refused the read because the checkpoint's tree is not this run's (another
    --model, --lora-rank or tokenizer): reading it again cannot help. Any other failure is retried;
    should Orbax reword this message, such a read is only retried in vain."""
    return isinstance(error, ValueError) and "tree structures do not match" in str(error)


def everywhere(ok: bool) -> bool:
    """Whether `ok` holds in every process of the job."""
    if jax.process_count() == 1:
        return ok
    return bool(np.all(multihost_utils.process_allgather(np.asarray(ok))))


class Checkpointer:
    """Keeps the last `keep` checkpoints under `directory` (local or gs://)."""

    def __init__(self, directory: str, *, keep: int, beside_multi_tier: bool = False):
        """`beside_multi_tier`: the run also saves through Orbax's ReplicatorCheckpointManager. Orbax numbers
        every save of a process from one counter and, when it creates a save's folder in the background, tells
        the other processes it exists under that number in the job's shared key-value store. The replicator's
        saves create their folders per process under the same numbers, which is how, we read it, a process
        took another save's word for this one's folder and wrote into one not yet made (CPU, two processes: 2 of 9
        runs of the multi-tier test, process 1's FileNotFoundError in step 7's temporary folder, then process 0
        waiting at the save's barrier for good; 0 of 12 runs since). Beside it, this tier makes its folders
        before the save returns; the write itself stays in the background."""
        self.directory = directory
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=True, create=True,
            async_options=ocp.AsyncOptions(create_directories_asynchronously=False) if beside_multi_tier else None,
        )
        with storage.writing("--checkpoint-dir", directory):
            self._manager = ocp.CheckpointManager(absolute_path(directory), options=options, item_names=("state", "data"))

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state, data_iterator) -> None:
        self._manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), data=grain.checkpoint.CheckpointSave(data_iterator)),
            force=True,
        )

    def restore_latest(self, abstract_state, data_iterator, *, warn=print_warning) -> tuple[int, object]:
        """(step, state) of the newest checkpoint that reads back, laid out like `abstract_state`
        (ShapeDtypeStructs with shardings); moves `data_iterator` to the batch after that step.

        Orbax restores only the step it is given, so a latest checkpoint that a crash or a full disk
        left damaged would stop every restart. A read that fails is tried again (a FUSE or GCS hiccup
        passes); a checkpoint that still does not read is moved aside into QUARANTINE_DIR, never
        deleted, once an older one has read back (its steps are trained and saved again). When the
        newest MAX_UNREADABLE_IN_A_ROW + 1 all fail, the cause is the run or the storage, not damage:
        nothing is moved and the run stops with one line.
        """
        failures: list[tuple[int, str]] = []
        for step in sorted(self._manager.all_steps(), reverse=True):
            if len(failures) > MAX_UNREADABLE_IN_A_ROW:
                break
            try:
                restored = self._read(step, abstract_state, data_iterator, warn)
            except _UNREADABLE as error:
                failures.append((step, f"{type(error).__name__}: {first_line(error)}"))
                continue
            for failed_step, reason in failures:
                place = self._quarantine(failed_step, reason.split(":")[0])
                warn(f"--checkpoint-dir {self.directory}: cannot restore step {failed_step} ({reason}); moved it to "
                     f"{place}, resuming from step {step}. To try it again, stop the run and move it back to "
                     f"{self._step_dir(failed_step)}")
            return step, restored["state"]
        listed = "; ".join(f"step {step}: {reason}" for step, reason in failures)
        if len(failures) == len(self._manager.all_steps()):
            found = f"no checkpoint there restores into this run ({listed})"
        else:
            found = f"its newest {len(failures)} checkpoints do not restore into this run ({listed}), older ones not tried"
        raise UserError(
            f"--checkpoint-dir {self.directory}: {found}; nothing was "
            "moved. They are of another run (another --model, --lora-rank or tokenizer?) or unreadable from here "
            "(permissions, another Orbax version): fix that, or use a new --workdir or --checkpoint-dir"
        )

    def _read(self, step: int, abstract_state, data_iterator, warn) -> dict:
        """Restores `step`, trying again after each delay of RETRY_DELAYS_S while the read fails (not
        when the checkpoint is of another run). With several processes, an attempt succeeds only if
        it did in every one of them."""
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=grain.checkpoint.CheckpointRestore(data_iterator)
        )
        for delay in (*RETRY_DELAYS_S, None):
            try:
                restored, error = self._manager.restore(step, args=args), None
            except _UNREADABLE as failed:
                restored, error = None, failed
            if everywhere(error is None):
                return restored
            if delay is None or _of_another_run(error):
                raise error or OSError(f"step {step} did not read in another process")
            warn(f"--checkpoint-dir {self.directory}: reading step {step} failed "
                 f"({first_line(error) if error else 'in another process'}); trying again in {delay:g} s")
            time.sleep(delay)

    def _step_dir(self, step: int) -> epath.Path:
        return absolute_path(self.directory) / str(step)

    def _quarantine(self, step: int, reason: str) -> epath.Path:
        """Moves the step's directory into QUARANTINE_DIR/<step>-<reason>, with its bytes as they are
        (process 0 moves, the others wait), and has Orbax forget the step."""
        quarantine = absolute_path(self.directory) / QUARANTINE_DIR
        place = quarantine / f"{step}-{reason}"
        if jax.process_index() == 0:
            quarantine.mkdir(parents=True, exist_ok=True)
            copy = 1
            while place.exists():  # the same step set aside before, trained again and damaged again
                copy += 1
                place = quarantine / f"{step}-{reason}-{copy}"
            self._step_dir(step).rename(place)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"quarantine step {step}")
        self._manager.reload()
        return place

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def export_params(params, path: str | pathlib.Path) -> str:
    """Writes params where `gm.ckpts.load_params(path)` reads them, replacing an earlier export only
    once the new one is whole. `path` is local (a bucket through its FUSE mount). Orbax saves
    collectively, so every process writes its shards under one temporary name that process 0 drew;
    process 0 then renames it into place (trainer.shared_files)."""
    path = pathlib.Path(os.path.abspath(path))
    temporary = path.with_name(f".{path.name}.partial-{_agreed_token()}")
    is_main = jax.process_index() == 0
    try:
        params_io.save_params(params, temporary)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"exported {temporary}")
        if is_main:
            shared_files.replace_directory(path, temporary)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"export {path}")
    finally:
        if is_main:  # what a failed save left: the temporary, or Orbax's own temporary beside it
            for leftover in path.parent.glob(f"{temporary.name}*"):
                shutil.rmtree(leftover)
    return str(path)


def _agreed_token() -> str:
    """A random hex token, the same in every process of the job (process 0's)."""
    token = np.frombuffer(os.urandom(8), np.int32)
    if jax.process_count() > 1:
        token = multihost_utils.broadcast_one_to_all(token)
    return np.asarray(token).tobytes().hex()
