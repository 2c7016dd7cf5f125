"""`trainer.run.local_checkpoints` in one process: a round trip of the state and the data position, a
sharded state saved shard by shard, torn and damaged steps never restored, another run's steps never
used (and never deleted), the choice between the two tiers, and --local-checkpoint-interval auto."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trainer.data import loader as data_lib
from trainer.errors import UserError
from trainer.run import local_checkpoints as local_lib

REPO = pathlib.Path(__file__).parents[3]
IDENTITY = "0123456789abcdef"


def _device():
    return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def _state(step: int) -> dict:
    return {"step": jnp.int32(step), "params": {"w": jnp.full((4, 3), float(step)), "b": jnp.arange(3, dtype=jnp.bfloat16) + step}}


def _abstract() -> dict:
    return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=_device()), _state(0))


class _Position:
    """A data iterator's checkpointable part: get_state() / set_state()."""

    def __init__(self, position=0):
        self.position = position

    def get_state(self):
        return {"position": self.position}

    def set_state(self, state):
        self.position = state["position"]


def _tier(directory, identity=IDENTITY, **kwargs):
    warnings = []
    tier = local_lib.LocalCheckpoints(str(directory), identity=identity, warn=warnings.append, **kwargs)
    return tier, warnings


def _saved(directory, steps=(1, 2, 3)):
    tier, _ = _tier(directory)
    for step in steps:
        tier.save(step, _state(step), _Position(step * 10))
    tier.close()
    return tier.folder


def _contents(directory: pathlib.Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*")) if path.is_file()}


def _assert_state(state, step):
    want = _state(step)
    assert jax.tree.structure(state) == jax.tree.structure(want)
    for got, expected in zip(jax.tree.leaves(state), jax.tree.leaves(want)):
        assert got.dtype == expected.dtype and got.sharding == _device()
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_a_round_trip_restores_the_state_and_the_data_position_and_keeps_the_last_two(tmp_path, tokenized_data):
    batches = lambda: data_lib.batches(tokenized_data, seq_len=16, global_batch_size=2, seed=0, prefetch=False)  # noqa: E731
    tier, _ = _tier(tmp_path)
    iterator = batches()
    for step in (1, 2, 3):
        next(iterator)
        tier.save(step, _state(step), iterator)
    tier.close()
    assert sorted(path.name for path in tier.folder.iterdir()) == ["2", "3"]
    assert tier.folder == tmp_path / f"process-{jax.process_index()}"
    after_three = next(iterator)

    reader, warnings = _tier(tmp_path)
    assert reader.agreed_steps() == [3, 2]
    resumed = batches()
    step, state = reader.restore([3, 2], _abstract(), resumed)
    assert step == 3 and not warnings
    _assert_state(state, 3)
    assert reader.restore_s is not None
    following = next(resumed)
    assert all(np.array_equal(following[key], after_three[key]) for key in after_three)


def test_a_save_leaves_the_states_shardings_whole_on_a_one_device_mesh(tmp_path):
    """A process with one device (the CPU, every 1x1 slice) holds the run's mesh-sharded state: the save once
    emptied each shard's cached device set (`devices().pop()`) and the next save failed with a KeyError."""
    one_device = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "fsdp"))
    sharding = jax.sharding.NamedSharding(one_device, jax.sharding.PartitionSpec())
    tier, warnings = _tier(tmp_path)
    for step in (1, 2):
        state = jax.device_put(_state(step), sharding)
        tier.save(step, state, _Position(step))
        assert all(len(leaf.sharding.device_set) == 1 for leaf in jax.tree.leaves(state))
    tier.close()
    assert sorted(path.name for path in tier.folder.iterdir()) == ["1", "2"] and not warnings


def test_a_sharded_state_is_saved_shard_by_shard_and_restored_only_into_the_same_slices(tmp_path):
    """Four CPU devices (a subprocess: the test process has one): a leaf split over four, one split
    over two and replicated over the other two, one replicated; a replicated slice is written once."""
    script = textwrap.dedent(f"""
        import json, pathlib, jax, jax.numpy as jnp, numpy as np
        from jax.sharding import NamedSharding, PartitionSpec as P
        from trainer.run import local_checkpoints as local_lib
        mesh = jax.make_mesh((2, 2), ("data", "fsdp"))
        shardings = {{"split4": NamedSharding(mesh, P(("data", "fsdp"))), "split2": NamedSharding(mesh, P("fsdp")),
                     "whole": NamedSharding(mesh, P())}}
        values = {{"split4": np.arange(32.0).reshape(8, 4), "split2": np.arange(6, dtype=np.int32),
                  "whole": np.float32(7)}}
        state = {{key: jax.device_put(values[key], shardings[key]) for key in values}}
        abstract = {{key: jax.ShapeDtypeStruct(np.shape(values[key]), state[key].dtype, sharding=shardings[key]) for key in values}}
        identity = local_lib.run_identity(abstract, run="run")
        tier = local_lib.LocalCheckpoints({str(tmp_path)!r}, identity=identity, interval="1")
        tier.after_step(5, state, type("It", (), {{"get_state": lambda self: {{"at": 5}}}})())
        tier.close()
        meta = json.loads((tier.folder / "5" / "meta.json").read_text())
        counts = {{key: sum(entry["leaf"] == f"['{{key}}']" for entry in meta["shards"]) for key in values}}
        restored, data = tier.read(5, abstract)
        same = all(np.array_equal(np.asarray(restored[key]), values[key]) and restored[key].sharding == shardings[key]
                   for key in values)
        other = dict(abstract, split2=jax.ShapeDtypeStruct((6,), jnp.int32, sharding=shardings["whole"]))
        try:
            tier.read(5, other)
            refused = "no"
        except ValueError as error:
            refused = str(error)
        print(json.dumps({{"counts": counts, "same": same, "data": data, "refused": refused,
                          "other_identity": local_lib.run_identity(other, run="run") != identity}}))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["counts"] == {"split4": 4, "split2": 2, "whole": 1}
    assert result["same"] and result["data"] == {"at": 5}
    assert "['split2']: the saved slices are not those this process holds" in result["refused"]
    assert result["other_identity"]


def test_the_identity_names_the_run_the_process_count_and_every_leafs_layout():
    abstract = _abstract()
    identity = local_lib.run_identity(abstract, run="gs://bucket/run/checkpoints")
    assert identity == local_lib.run_identity(_abstract(), run="gs://bucket/run/checkpoints")
    assert identity != local_lib.run_identity(abstract, run="gs://bucket/other/checkpoints")
    wider = dict(abstract, params=dict(abstract["params"], w=jax.ShapeDtypeStruct((4, 4), jnp.float32, sharding=_device())))
    assert identity != local_lib.run_identity(wider, run="gs://bucket/run/checkpoints")
    other_dtype = dict(abstract, step=jax.ShapeDtypeStruct((), jnp.int64 if jax.config.jax_enable_x64 else jnp.uint32,
                                                            sharding=_device()))
    assert identity != local_lib.run_identity(other_dtype, run="gs://bucket/run/checkpoints")


def test_steps_of_another_run_are_never_restored_nor_deleted_but_moved_aside_with_one_warning(tmp_path):
    folder = _saved(tmp_path)
    before = _contents(folder)
    tier, warnings = _tier(tmp_path, identity="fedcba9876543210")
    assert tier.agreed_steps() == []
    assert len(warnings) == 1 and "steps 2, 3 of process 0 are of another run or layout" in warnings[0], warnings
    quarantine = folder / local_lib.QUARANTINE_DIR
    assert sorted(path.name for path in quarantine.iterdir()) == ["2-another-run", "3-another-run"]
    assert _contents(quarantine) == {name.replace(name.split("/")[0], name.split("/")[0] + "-another-run", 1): data
                                     for name, data in before.items()}  # every byte kept
    # Its own saves go on beside them, and a read of a step it would not list is refused too.
    tier.save(2, _state(2), _Position())
    tier.close()
    assert tier.agreed_steps() == [2]
    os.rename(quarantine / "3-another-run", folder / "3")
    with pytest.raises(ValueError, match="another run"):
        tier.read(3, _abstract())


def test_a_torn_save_leaves_a_temporary_never_listed_and_removed_only_when_its_and_older(tmp_path):
    folder = _saved(tmp_path, steps=(1, 2))
    ours = folder / f"{local_lib.TEMPORARY_PREFIX}3-{IDENTITY}-deadbeef"
    theirs = folder / f"{local_lib.TEMPORARY_PREFIX}3-fedcba9876543210-deadbeef"
    newer = folder / f"{local_lib.TEMPORARY_PREFIX}9-{IDENTITY}-deadbeef"
    for temporary in (ours, theirs, newer):
        temporary.mkdir()
        (temporary / local_lib.SHARDS).write_bytes(b"\x00" * 10)  # killed mid-write: no meta.json
    tier, warnings = _tier(tmp_path)
    assert tier.agreed_steps() == [2, 1] and not warnings
    tier.save(4, _state(4), _Position())
    tier.close()
    assert not ours.exists()  # ours, of step 3 < 4: it can never complete
    assert theirs.exists() and newer.exists()  # another run's, and one newer than anything complete


def _flip_a_byte(path: pathlib.Path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [
    lambda step: (step / local_lib.SHARDS).write_bytes((step / local_lib.SHARDS).read_bytes()[:-5]),
    lambda step: _flip_a_byte(step / local_lib.SHARDS),
    lambda step: (step / local_lib.DATA).write_text('{"position": 31}'),  # still JSON: only the checksum tells
    lambda step: (step / local_lib.SHARDS).unlink(),
    lambda step: (step / local_lib.META).write_text('{"format": 1, "identity": "' + IDENTITY + '", "shards": [{"leaf"'),
], ids=["shards-truncated", "shards-flipped", "data-changed", "shards-missing", "meta-torn"])
def test_a_damaged_step_is_moved_aside_with_its_bytes_and_the_next_one_restored(tmp_path, damage):
    folder = _saved(tmp_path)
    damage(folder / "3")
    damaged = _contents(folder / "3")
    tier, warnings = _tier(tmp_path)
    position = _Position()
    candidates = tier.agreed_steps()
    restored = tier.restore(candidates, _abstract(), position)
    assert restored is not None and restored[0] == 2 and position.position == 20
    _assert_state(restored[1], 2)
    assert len(warnings) == 1 and "step 3 of process 0" in warnings[0] and "moved it to" in warnings[0], warnings
    (quarantined,) = (folder / local_lib.QUARANTINE_DIR).iterdir()
    assert quarantined.name.startswith("3-") and _contents(quarantined) == damaged
    assert sorted(path.name for path in folder.iterdir() if path.name.isdigit()) == ["2"]


def test_a_step_without_its_completeness_marker_is_never_listed(tmp_path):
    folder = _saved(tmp_path)
    (folder / "3" / local_lib.META).unlink()
    tier, warnings = _tier(tmp_path)
    assert tier.agreed_steps() == [2]
    assert len(warnings) == 1 and "step 3 of process 0 is not complete" in warnings[0], warnings
    assert (folder / local_lib.QUARANTINE_DIR / "3-unreadable-meta" / local_lib.SHARDS).exists()


class _Persistent:
    directory = "gs://bucket/run/checkpoints"

    def __init__(self, step):
        self.step = step

    def latest_step(self):
        return self.step

    def restore_latest(self, abstract, iterator):
        iterator.set_state({"position": self.step * 10})
        return self.step, _state(self.step)


@pytest.mark.parametrize("persistent_step, tier, step", [(None, "local", 3), (2, "local", 3), (3, "local", 3), (4, "persistent", 4)])
def test_the_newer_tier_is_restored_the_local_one_when_as_new(tmp_path, persistent_step, tier, step):
    _saved(tmp_path)
    local, _ = _tier(tmp_path)
    tiers = local_lib.Tiers(_Persistent(persistent_step), local)
    assert tiers.newest_step() == max(3, persistent_step or 0)
    position = _Position()
    resumed = tiers.restore(_abstract(), position)
    assert (resumed.tier, resumed.step, position.position) == (tier, step, step * 10)
    _assert_state(resumed.state, step)


def test_local_steps_newer_than_the_resumed_one_are_dropped_and_saved_again(tmp_path):
    folder = _saved(tmp_path)
    local, _ = _tier(tmp_path)
    (folder / "3" / local_lib.SHARDS).unlink()  # step 3 does not read: the run resumes from 2
    resumed = local_lib.Tiers(_Persistent(None), local).restore(_abstract(), _Position())
    assert resumed.step == 2
    local.save(3, _state(33), _Position())
    local.close()
    assert local.agreed_steps() == [3, 2]
    assert float(local.read(3, _abstract())[0]["params"]["w"][0, 0]) == 33


def test_no_local_step_that_reads_and_no_persistent_one_is_one_line(tmp_path):
    folder = _saved(tmp_path, steps=(1,))
    (folder / "1" / local_lib.SHARDS).unlink()
    local, _ = _tier(tmp_path)
    with pytest.raises(UserError, match="no local step restores"):
        local_lib.Tiers(_Persistent(None), local).restore(_abstract(), _Position())


def test_auto_times_the_steps_and_the_first_save_and_says_what_it_chose(tmp_path, monkeypatch):
    said = []
    tier, _ = _tier(tmp_path, interval="auto", say=said.append)
    monkeypatch.setattr(local_lib.LocalCheckpoints, "save", lambda self, step, state, iterator: 0.05)  # 50 ms a save
    clock = iter([100.0, 100.3])  # 3 steps in 300 ms: 100 ms a step
    monkeypatch.setattr(local_lib.time, "perf_counter", lambda: next(clock))
    for step in range(11, 15):
        tier.after_step(step, _state(step), _Position())
    assert tier.interval == 25  # ceil(50 ms / (2% of 100 ms))
    assert len(said) == 1 and said[0].startswith("--local-checkpoint-interval auto: every 25 steps"), said


def test_a_directory_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match=r"--local-checkpoint-dir .*/file/sub: cannot use it"):
        _tier(tmp_path / "file" / "sub")


def test_the_tiny_models_local_save_and_restore_times(tmp_path):
    """Measured, printed, not asserted (`pytest -s`): the tiny model's float32 full fine-tune state
    (weights, AdamW's mu and nu) on this machine's CPU. docs/architecture.md scales it to Gemma 3."""
    from trainer.model import models

    params = models.init_params(models.model_config("tiny", vocab_size=512), seed=0)
    state = {"step": jnp.int32(1), "params": params, "opt_state": {"mu": params, "nu": params}}
    abstract = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding), state)
    tier, _ = _tier(tmp_path)
    blocked = [tier.save(step, state, _Position(step)) for step in (1, 2, 3)]
    started = time.perf_counter()
    tier.close()
    write_s = time.perf_counter() - started
    step, restored = tier.restore([3], abstract, _Position())
    size = sum(leaf.nbytes for leaf in jax.tree.leaves(state))
    print(f"\nlocal tier, tiny model state {size / 2**20:.1f} MiB on CPU: a save blocks {min(blocked) * 1e3:.1f} ms "
          f"(of {', '.join(f'{b * 1e3:.1f}' for b in blocked)}), the last write finished {write_s * 1e3:.1f} ms after close(), "
          f"restore {tier.restore_s * 1e3:.1f} ms")
    assert step == 3 and jax.tree.structure(restored) == jax.tree.structure(state)


@pytest.mark.parametrize("peer_steps, agreed", [([2, 3], [3, 2]), ([2], [2]), ([], []), ([1, 2, 3, 4], [3, 2])])
def test_the_job_agrees_on_the_steps_every_process_holds(tmp_path, monkeypatch, peer_steps, agreed):
    """A second process (its offer stands in for process_allgather's answer): only steps both hold count;
    one whose tier is gone (a replaced host) leaves none."""
    _saved(tmp_path)
    tier, _ = _tier(tmp_path)
    monkeypatch.setattr(local_lib.jax, "process_count", lambda: 2)

    def allgather(mine):
        peer = np.full(local_lib.OFFERED_STEPS, -1, np.int64)
        peer[: len(peer_steps)] = peer_steps
        return np.stack([mine, peer])

    monkeypatch.setattr(local_lib.multihost_utils, "process_allgather", allgather)
    assert tier.agreed_steps() == agreed


def test_a_step_whose_loss_is_not_finite_is_not_saved(tmp_path):
    tier, _ = _tier(tmp_path, interval="1")
    tier.after_step(1, _state(1), _Position(), {"loss": jnp.float32(2.0), "grad_norm": jnp.float32(1.0)})
    tier.after_step(2, _state(2), _Position(), {"loss": jnp.float32(np.nan), "grad_norm": jnp.float32(1.0)})
    tier.close()
    assert tier.agreed_steps() == [1]
