"""Orbax checkpoints of the train state together with the data iterator's position, and the final export.

One checkpoint = {"state": step, trained params, optimizer state (sharded, every process writes
its shards), "data": the grain iterator state (one file per process)}. Saves are asynchronous;
`close()` waits for the last one.
"""

from __future__ import annotations

import os
import pathlib
import sys

import grain
import jax
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils
from gemma import gm

from trainer.errors import UserError

# What Orbax and grain raise for a checkpoint they cannot read into the given tree: a tree or shape
# mismatch or damaged tensor data (ValueError), a missing item (KeyError), a missing file (OSError).
_UNREADABLE = (ValueError, KeyError, OSError)


def print_warning(message: str) -> None:
    print(f"trainer: warning: {message}", file=sys.stderr, flush=True)


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:200]


def absolute_path(path: str | pathlib.Path) -> epath.Path:
    """Orbax wants absolute paths; a URL (gs://...) already is one."""
    return epath.Path(path if "://" in str(path) else os.path.abspath(path))


class Checkpointer:
    """Keeps the last `keep` checkpoints under `directory` (local or gs://)."""

    def __init__(self, directory: str, *, keep: int):
        self.directory = directory
        try:
            self._manager = ocp.CheckpointManager(
                absolute_path(directory),
                options=ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True, create=True),
                item_names=("state", "data"),
            )
        except (OSError, ValueError) as error:
            reason = getattr(error, "strerror", None) or error  # an OSError's reason without its absolute path
            raise UserError(f"--checkpoint-dir {directory}: cannot use it ({reason}); choose a directory this job can write") from None

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
        left damaged would stop every restart. Each one that fails to read is reported through `warn`
        and deleted (its step is trained and saved again), and the one before it is tried.
        """
        failures = []
        for step in sorted(self._manager.all_steps(), reverse=True):
            try:
                restored = self._manager.restore(
                    step,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(abstract_state), data=grain.checkpoint.CheckpointRestore(data_iterator)
                    ),
                )
            except _UNREADABLE as error:
                failures.append(f"step {step}: {_first_line(error)}")
                continue
            for failure in failures:
                warn(f"--checkpoint-dir {self.directory}: cannot restore {failure}; deleted it, resuming from step {step}")
            for damaged in self._manager.all_steps():
                if damaged > step:
                    self._manager.delete(damaged)
            return step, restored["state"]
        raise UserError(
            f"--checkpoint-dir {self.directory}: no checkpoint there restores into this run ({'; '.join(failures)}); "
            "they are damaged or of another run (another --model, --lora-rank or tokenizer?): "
            "use a new --workdir or --checkpoint-dir"
        )

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def export_params(params, path: str | pathlib.Path) -> str:
    """Writes params where `gm.ckpts.load_params(path)` reads them (overwriting an earlier export)."""
    path = absolute_path(path)
    if path.exists() and jax.process_index() == 0:
        path.rmtree()
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"export {path}")
    gm.ckpts.save_params(params, path, wait_until_finished=True)
    return str(path)
