"""Fault injection on real `python -m trainer` processes of the tiny model: SIGTERM (a preemption
notice) and SIGKILL at seeded random steps, and damaged checkpoints. Whatever happens, the run ends
with the parameters of an uninterrupted run and has trained every step on the same batch.

Each record of metrics.jsonl names the batch its step consumed (`batch`, a digest of the rows), so
"the same batches" is checked step by step, not inferred from the final parameters.
"""

import dataclasses
import json
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from gemma import gm

from tests.trainer.measure.test_goodput import assert_accounts_for_the_wall_time
from tests.trainer.test_train import tiny_args
from trainer import contract
from trainer.run import checkpoint
from trainer.__main__ import main

REPO = pathlib.Path(__file__).parents[2]
STEPS = 40
CHECKPOINT_INTERVAL = 4
KEEP_CHECKPOINTS = 3
SIGTERM_POINTS = 5
SIGKILL_POINTS = 2
SEED = 20261202  # of the kill points
# A process of the tiny model takes ~20 s to start on a loaded 2-core machine, then ~25 steps/s.
PROCESS_TIMEOUT_S = 300


def _args(workdir, prepared_dir, tokenizer_path):
    return tiny_args(workdir, prepared_dir, tokenizer_path, "--steps", str(STEPS), "--log-interval", "1",
                     "--eval-fraction", "0", "--checkpoint-interval", str(CHECKPOINT_INTERVAL),
                     "--keep-checkpoints", str(KEEP_CHECKPOINTS), "--seq-len", "32", "--batch-size", "4")


@dataclasses.dataclass(frozen=True)
class _Inputs:
    prepared_dir: pathlib.Path
    tokenizer_path: pathlib.Path
    compilation_cache: pathlib.Path


class _Trainer:
    """One `python -m trainer` process; its output goes to files, so a full pipe never stalls it."""

    def __init__(self, workdir: pathlib.Path, inputs: _Inputs, name: str):
        self.workdir = workdir
        self.stdout_path = workdir.parent / f"{name}.stdout"
        self.stderr_path = workdir.parent / f"{name}.stderr"
        prepared_dir, tokenizer_path = inputs.prepared_dir, inputs.tokenizer_path
        # Every process compiles the same functions: a shared persistent cache spares the restarts that.
        env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_COMPILATION_CACHE_DIR": str(inputs.compilation_cache),
               "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
        with self.stdout_path.open("w") as stdout, self.stderr_path.open("w") as stderr:
            self.process = subprocess.Popen([sys.executable, "-m", "trainer", *_args(workdir, prepared_dir, tokenizer_path)],
                                            stdout=stdout, stderr=stderr, env=env, cwd=REPO)

    def wait_for_step(self, step: int) -> None:
        """Returns once the run has reported `step` (or a later one)."""
        deadline = time.monotonic() + PROCESS_TIMEOUT_S
        while not any(record["step"] >= step for record in _complete_records(self.workdir)):
            assert self.process.poll() is None, f"the run ended before step {step}: {self.output()}"
            assert time.monotonic() < deadline, f"no step {step} after {PROCESS_TIMEOUT_S} s: {self.output()}"
            time.sleep(0.01)

    def finish(self) -> int:
        return self.process.wait(timeout=PROCESS_TIMEOUT_S)

    def stdout(self) -> str:
        return self.stdout_path.read_text()

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def output(self) -> str:
        return (self.stdout() + self.stderr())[-3000:]


def _complete_records(workdir: pathlib.Path) -> list[dict]:
    """The records of metrics.jsonl that are fully written (a running trainer may be mid-line)."""
    path = workdir / "metrics.jsonl"
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line]


def _training_records(workdir: pathlib.Path) -> list[dict]:
    return [record for record in _complete_records(workdir) if "loss" in record]


def _resumed_from(run: _Trainer) -> int | None:
    found = re.search(r"resuming from the checkpoint of step (\d+)", run.stdout())
    return int(found.group(1)) if found else None


def _completed_checkpoints(workdir: pathlib.Path) -> list[int]:
    """Steps Orbax finished saving: it writes a step into a temporary directory and renames it when complete."""
    return sorted(int(path.name) for path in (workdir / "checkpoints").iterdir() if path.name.isdigit())


def _assert_same_params(workdir: pathlib.Path, reference: pathlib.Path) -> None:
    want = gm.ckpts.load_params(reference / "export" / "params")
    got = gm.ckpts.load_params(workdir / "export" / "params")
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _by_step(records: list[dict]) -> dict[int, tuple]:
    return {record["step"]: (record["batch"], record["loss"]) for record in records}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, prepared_dir, tokenizer_path) -> _Inputs:
    return _Inputs(prepared_dir, tokenizer_path, tmp_path_factory.mktemp("jax_compilation_cache"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, inputs) -> pathlib.Path:
    """The uninterrupted run, checkpointing every CHECKPOINT_INTERVAL steps like the interrupted ones."""
    workdir = tmp_path_factory.mktemp("faults") / "reference"
    run = _Trainer(workdir, inputs, "reference")
    assert run.finish() == contract.OK, run.output()
    assert [record["step"] for record in _training_records(workdir)] == list(range(1, STEPS + 1))
    return workdir


def test_every_step_names_its_batch_and_the_batches_differ(reference):
    batches = [record["batch"] for record in _training_records(reference)]
    assert len(set(batches)) == STEPS


def test_a_run_prints_no_native_start_up_notices(reference):
    stderr = (reference.parent / "reference.stderr").read_text()
    assert "oneDNN" not in stderr and "absl::InitializeLog" not in stderr, stderr


def test_sigterm_at_random_steps_loses_no_step_and_changes_nothing(reference, tmp_path, inputs):
    workdir = tmp_path / "run"
    kill_points = sorted(random.Random(SEED).sample(range(2, STEPS - 8), SIGTERM_POINTS))
    checkpointed = []
    for number, point in enumerate(kill_points):
        run = _Trainer(workdir, inputs, f"sigterm-{number}")
        run.wait_for_step(max(point, checkpointed[-1] + 1 if checkpointed else 1))
        run.process.send_signal(signal.SIGTERM)
        assert run.finish() == contract.RETRY, run.output()
        assert _resumed_from(run) == (checkpointed[-1] if checkpointed else None)
        checkpointed.append(int(re.search(r"preempted: checkpointed step (\d+)", run.stderr()).group(1)))
    final = _Trainer(workdir, inputs, "sigterm-final")
    assert final.finish() == contract.OK, final.output()
    assert _resumed_from(final) == checkpointed[-1]

    assert len(set(checkpointed)) == SIGTERM_POINTS, checkpointed
    records = _training_records(workdir)
    assert [record["step"] for record in records] == list(range(1, STEPS + 1))  # each step once, none lost
    assert _by_step(records) == _by_step(_training_records(reference))  # the same batch and loss at every step
    _assert_same_params(workdir, reference)


def test_sigkill_at_random_steps_resumes_from_the_last_completed_checkpoint(reference, tmp_path, inputs):
    workdir = tmp_path / "run"
    # From the second interval on: Orbax starts a save only once the one before has finished, so a
    # completed checkpoint exists to resume from.
    kill_points = sorted(random.Random(SEED + 1).sample(range(2 * CHECKPOINT_INTERVAL + 1, STEPS - 8), SIGKILL_POINTS))
    expected_resume, lost_steps = None, False
    for number, point in enumerate(kill_points):
        run = _Trainer(workdir, inputs, f"sigkill-{number}")
        run.wait_for_step(max(point, (expected_resume or 0) + 1))
        run.process.kill()
        assert run.finish() == -signal.SIGKILL
        assert _resumed_from(run) == expected_resume
        reached = _training_records(workdir)[-1]["step"]
        expected_resume = _completed_checkpoints(workdir)[-1]
        lost_steps = lost_steps or reached > expected_resume
        # The newest due checkpoint may still have been in flight (saves are asynchronous).
        assert expected_resume in range(reached - reached % CHECKPOINT_INTERVAL - CHECKPOINT_INTERVAL, reached + 1)
    final = _Trainer(workdir, inputs, "sigkill-final")
    assert final.finish() == contract.OK, final.output()
    assert _resumed_from(final) == expected_resume

    records = _training_records(workdir)
    want = _by_step(_training_records(reference))
    assert sorted({record["step"] for record in records}) == list(range(1, STEPS + 1))
    # Steps trained again after a kill met the same batch and gave the same loss as the first time.
    for record in records:
        assert (record["batch"], record["loss"]) == want[record["step"]], record["step"]
    _assert_same_params(workdir, reference)
    # Every second of the three attempts accounted; the steps trained again were lost the first time.
    breakdown = assert_accounts_for_the_wall_time(workdir, attempts=SIGKILL_POINTS + 1)
    assert breakdown.seconds["WASTED_PROGRESS_FROM_DISRUPTION"] > 0 or not lost_steps
    assert breakdown.seconds["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] > 0


def _truncate_tensor_data(step_dir: pathlib.Path) -> None:
    for path in (step_dir / "state").rglob("*"):
        if path.is_file() and path.parent.name == "d":
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garble_data_position(step_dir: pathlib.Path) -> None:
    for path in (step_dir / "data").glob("process_*.json"):
        path.write_bytes(b"\x00not json")


def _lose_the_state(step_dir: pathlib.Path) -> None:
    shutil.rmtree(step_dir / "state")


def _leave_half_written(step_dir: pathlib.Path) -> None:
    """What a kill in the middle of a save leaves: Orbax's temporary directory, never renamed."""
    step_dir.rename(step_dir.with_name(f"{step_dir.name}.orbax-checkpoint-tmp-1"))


def _contents(directory: pathlib.Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*")) if path.is_file()}


@pytest.fixture
def no_retry_delay(monkeypatch):
    """Reads are still tried again (the tests count the attempts), without the waits between them."""
    monkeypatch.setattr(checkpoint, "RETRY_DELAYS_S", (0.0, 0.0))


@pytest.mark.parametrize("damage", [_truncate_tensor_data, _garble_data_position, _lose_the_state, _leave_half_written],
                         ids=lambda damage: damage.__name__.strip("_"))
def test_a_damaged_latest_checkpoint_is_set_aside_and_the_run_falls_back_to_the_previous_one(
        damage, reference, tmp_path, capsys, prepared_dir, tokenizer_path, no_retry_delay):
    """The reference's newest checkpoint (the last step) is damaged; the run resumes from the one
    before, trains the steps after it again, and ends where the reference ended. The damaged one is
    moved into checkpoints/quarantine with its bytes as they were, never deleted."""
    workdir = tmp_path / "run"
    shutil.copytree(reference / "checkpoints", workdir / "checkpoints")
    latest, previous = _completed_checkpoints(workdir)[-1], _completed_checkpoints(workdir)[-2]
    damage(workdir / "checkpoints" / str(latest))
    damaged = {path.name: _contents(path) for path in (workdir / "checkpoints").iterdir() if path.name.startswith(str(latest))}

    assert main(_args(workdir, prepared_dir, tokenizer_path)) == contract.OK
    captured = capsys.readouterr()
    assert f"resuming from the checkpoint of step {previous}" in captured.out
    if damage is not _leave_half_written:  # Orbax itself never lists a temporary directory
        assert captured.err.count(f"reading step {latest} failed") == len(checkpoint.RETRY_DELAYS_S), captured.err
        moved = re.search(rf"trainer: warning: --checkpoint-dir \S+: cannot restore step {latest} \(.+\); moved it to "
                          rf"(\S+), resuming from step {previous}\. To try it again, stop the run and move it back to "
                          rf"\S+/checkpoints/{latest}\n", captured.err)  # fmt: skip
        assert moved, captured.err
        quarantined = pathlib.Path(moved.group(1))
        assert quarantined.parent == workdir / "checkpoints" / checkpoint.QUARANTINE_DIR
        assert quarantined.name.startswith(f"{latest}-")
        assert _contents(quarantined) == damaged[str(latest)]  # every byte kept
    assert _completed_checkpoints(workdir)[-KEEP_CHECKPOINTS:] == _completed_checkpoints(reference)
    records = _training_records(workdir)
    assert [record["step"] for record in records] == list(range(previous + 1, STEPS + 1))
    want = _by_step(_training_records(reference))
    assert _by_step(records) == {step: want[step] for step in range(previous + 1, STEPS + 1)}
    _assert_same_params(workdir, reference)


def test_every_checkpoint_damaged_is_one_line_no_fresh_start_and_nothing_moved(
        reference, tmp_path, capsys, prepared_dir, tokenizer_path, no_retry_delay):
    workdir = tmp_path / "run"
    shutil.copytree(reference / "checkpoints", workdir / "checkpoints")
    for step in _completed_checkpoints(workdir):
        _lose_the_state(workdir / "checkpoints" / str(step))
    before = _contents(workdir / "checkpoints")

    assert main(_args(workdir, prepared_dir, tokenizer_path)) == contract.USER_ERROR
    err = capsys.readouterr().err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and "Traceback" not in err, err
    assert "no checkpoint there restores into this run" in err and "nothing was moved" in err
    assert "use a new --workdir or --checkpoint-dir" in err
    assert _contents(workdir / "checkpoints") == before
    assert not (workdir / "metrics.jsonl").exists() and not (workdir / "export").exists()
