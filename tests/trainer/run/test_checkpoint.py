"""`trainer.run.checkpoint.Checkpointer` on a small state: a read that fails for a passing reason is
tried again before anything moves; one that keeps failing is moved aside, never deleted. The final
export replaces an earlier one only when it is whole."""

import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gemma import gm

from trainer.model import params_io
from trainer.run import checkpoint
from trainer.data import loader as data_lib
from trainer.errors import UserError

STEPS = 4


@pytest.fixture
def saved(tmp_path, tokenized_data, monkeypatch):
    """(directory, abstract state, a fresh data iterator): checkpoints of steps 1 to STEPS of a small state."""
    monkeypatch.setattr(checkpoint, "RETRY_DELAYS_S", (0.0, 0.0))
    batches = lambda: data_lib.batches(tokenized_data, seq_len=16, global_batch_size=2, seed=0, prefetch=False)  # noqa: E731
    directory = tmp_path / "checkpoints"
    writer, iterator = checkpoint.Checkpointer(str(directory), keep=STEPS), batches()
    for step in range(1, STEPS + 1):
        next(iterator)
        writer.save(step, {"step": jnp.int32(step), "w": jnp.full(4, float(step))}, iterator)
    writer.close()
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = {"step": jax.ShapeDtypeStruct((), jnp.int32, sharding=device),
                "w": jax.ShapeDtypeStruct((4,), jnp.float32, sharding=device)}  # fmt: skip
    return directory, abstract, batches()


def _contents(directory: pathlib.Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*")) if path.is_file()}


def test_a_read_that_fails_once_is_tried_again_before_anything_moves(saved):
    directory, abstract, iterator = saved
    state_dir = directory / "4" / "state"
    away = state_dir.with_name("state.away")
    state_dir.rename(away)  # the storage does not show it for a moment
    warnings = []

    def warn(message):
        warnings.append(message)
        if "trying again" in message and away.exists():
            away.rename(state_dir)  # ...and then does

    reader = checkpoint.Checkpointer(str(directory), keep=STEPS)
    step, state = reader.restore_latest(abstract, iterator, warn=warn)
    reader.close()
    assert step == 4 and float(state["w"][0]) == 4.0
    assert len(warnings) == 1 and "reading step 4 failed" in warnings[0], warnings
    assert sorted(path.name for path in directory.iterdir()) == ["1", "2", "3", "4"]  # nothing moved


def test_a_read_that_keeps_failing_moves_the_step_aside_with_its_bytes(saved):
    directory, abstract, iterator = saved
    shutil.rmtree(directory / "4" / "state")
    damaged = _contents(directory / "4")
    warnings = []

    reader = checkpoint.Checkpointer(str(directory), keep=STEPS)
    step, state = reader.restore_latest(abstract, iterator, warn=warnings.append)
    assert step == 3 and float(state["w"][0]) == 3.0
    assert reader.latest_step() == 3  # Orbax no longer lists the step set aside
    reader.close()
    retries, (moved,) = warnings[:-1], warnings[-1:]
    assert len(retries) == len(checkpoint.RETRY_DELAYS_S) and all("reading step 4 failed" in w for w in retries)
    (quarantined,) = (directory / checkpoint.QUARANTINE_DIR).iterdir()
    assert quarantined.name.startswith("4-") and f"moved it to {quarantined}" in moved
    assert _contents(quarantined) == damaged
    assert sorted(path.name for path in directory.iterdir()) == ["1", "2", "3", checkpoint.QUARANTINE_DIR]


def test_more_unreadable_checkpoints_in_a_row_than_the_limit_stop_the_run_and_move_nothing(saved):
    directory, abstract, iterator = saved
    unreadable = list(range(STEPS, STEPS - checkpoint.MAX_UNREADABLE_IN_A_ROW - 1, -1))  # the newest K + 1
    assert 1 not in unreadable  # an older readable one remains, and is not walked back to
    for step in unreadable:
        shutil.rmtree(directory / str(step) / "state")
    before = _contents(directory)

    reader = checkpoint.Checkpointer(str(directory), keep=STEPS)
    with pytest.raises(UserError, match=f"its newest {len(unreadable)} checkpoints do not restore into this run .*, older ones not tried") as refused:
        reader.restore_latest(abstract, iterator, warn=lambda message: None)
    reader.close()
    assert [f"step {step}:" in str(refused.value) for step in range(STEPS, 0, -1)] == [True] * len(unreadable) + [False]
    assert "nothing was moved" in str(refused.value)
    assert _contents(directory) == before


def _params(value: float) -> dict:
    return {"layer": {"w": jnp.full((2, 3), value)}}


def test_an_export_replaces_the_earlier_one_and_leaves_nothing_beside_it(tmp_path):
    checkpoint.export_params(_params(1.0), tmp_path / "params")
    assert checkpoint.export_params(_params(2.0), tmp_path / "params") == str(tmp_path / "params")
    assert float(gm.ckpts.load_params(tmp_path / "params")["layer"]["w"][0, 0]) == 2.0
    assert [path.name for path in tmp_path.iterdir()] == ["params"]


def test_an_export_that_fails_midway_keeps_the_earlier_one_whole(tmp_path, monkeypatch):
    """A run that dies while exporting (a full disk, a preemption) leaves the previous export readable."""
    checkpoint.export_params(_params(1.0), tmp_path / "params")
    earlier = _contents(tmp_path / "params")
    save = params_io.save_params

    def disk_full(params, path, **options):
        save(params, path, **options)  # the new export half-written: its files are there, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(params_io, "save_params", disk_full)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.export_params(_params(2.0), tmp_path / "params")
    assert _contents(tmp_path / "params") == earlier
    assert float(gm.ckpts.load_params(tmp_path / "params")["layer"]["w"][0, 0]) == 1.0
    assert [path.name for path in tmp_path.iterdir()] == ["params"]
