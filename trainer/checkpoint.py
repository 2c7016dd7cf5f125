"""Orbax checkpoints of the train state together with the data iterator's position, and the final export.

One checkpoint = {"state": step, trained params, optimizer state (sharded, every process writes
its shards), "data": the grain iterator state (one file per process)}. Saves are asynchronous;
`close()` waits for the last one.
"""

from __future__ import annotations

import os
import pathlib

import grain
import jax
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils
from gemma import gm

from trainer.errors import UserError


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
            raise UserError(f"--checkpoint-dir {directory}: cannot use it ({error})") from None

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state, data_iterator) -> None:
        self._manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), data=grain.checkpoint.CheckpointSave(data_iterator)),
            force=True,
        )

    def restore(self, step: int, abstract_state, data_iterator):
        """The state at `step` laid out like `abstract_state` (ShapeDtypeStructs with shardings); moves
        `data_iterator` to the batch after that step."""
        try:
            restored = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state), data=grain.checkpoint.CheckpointRestore(data_iterator)
                ),
            )
        except ValueError as error:  # a tree or shape mismatch: the checkpoint is of another run
            raise UserError(
                f"--checkpoint-dir {self.directory}: its step {step} does not fit this run (another --model, --lora-rank "
                f"or tokenizer?): {str(error).splitlines()[0][:200]}; use a new --workdir or --checkpoint-dir"
            ) from None
        return restored["state"]

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
