"""Stopping and resuming: the same parameters and batches as an uninterrupted run; SIGTERM checkpoints
and asks for a restart."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
from gemma import gm

from trainer import contract, loop
from trainer.config import parse_config
from trainer.run.metrics import read_metrics
from tests.trainer.measure.test_goodput import assert_accounts_for_the_wall_time
from tests.trainer.test_train import tiny_args

STEPS = 8


def _run(workdir, prepared_dir, tokenizer_path, steps):
    # Constant learning rate: a schedule over --steps would differ between a 4- and an 8-step run.
    args = tiny_args(workdir, prepared_dir, tokenizer_path, "--steps", str(steps), "--lr-schedule", "constant",
                     "--lr", "3e-3", "--log-interval", "1", "--eval-fraction", "0", "--checkpoint-interval", "100")
    loop.train(parse_config(args))


def _losses(workdir):
    return {r["step"]: r["loss"] for r in read_metrics(pathlib.Path(workdir) / "metrics.jsonl") if "loss" in r}


def _steps_reported(workdir):
    """The steps metrics.jsonl reports a loss for, in the order the runs appended them."""
    return [r["step"] for r in read_metrics(pathlib.Path(workdir) / "metrics.jsonl") if "loss" in r]


def test_stop_and_resume_gives_the_parameters_and_batches_of_a_straight_run(tmp_path, prepared_dir, tokenizer_path, capsys):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _run(straight, prepared_dir, tokenizer_path, STEPS)
    _run(resumed, prepared_dir, tokenizer_path, STEPS // 2)
    capsys.readouterr()
    _run(resumed, prepared_dir, tokenizer_path, STEPS)
    assert f"resuming from the checkpoint of step {STEPS // 2} in " in capsys.readouterr().out
    # The second run trained the later steps only: a run that ignored the checkpoint would append 1..8 again.
    assert _steps_reported(resumed) == list(range(1, STEPS + 1))
    # Equal losses after the resume: the same batches met the same parameters.
    assert _losses(resumed) == _losses(straight)
    # Two attempts, the second resumed from the first's last checkpoint: nothing lost, every second accounted.
    breakdown = assert_accounts_for_the_wall_time(resumed, attempts=2)
    assert breakdown.seconds["WASTED_PROGRESS_FROM_DISRUPTION"] == 0
    assert breakdown.seconds["UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"] > 0
    assert breakdown.seconds["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] > 0
    assert {"goodput", "badput_data_loading_sync"} <= set(read_metrics(resumed / "metrics.jsonl")[-1])
    want = gm.ckpts.load_params(straight / "export" / "params")
    got = gm.ckpts.load_params(resumed / "export" / "params")
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _trainer(cwd, prepared_dir, tokenizer_path, steps):
    """`python -m trainer` in `cwd` with the relative --workdir `run`, as a user would type it."""
    args = tiny_args("run", prepared_dir, tokenizer_path, "--steps", str(steps), "--log-interval", "1",
                     "--eval-fraction", "0", "--checkpoint-interval", "1000")
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).parents[2])}
    return subprocess.Popen([sys.executable, "-m", "trainer", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=cwd, env=env)


def test_sigterm_checkpoints_exits_with_retry_and_the_restart_resumes(tmp_path, prepared_dir, tokenizer_path):
    metrics = tmp_path / "run" / "metrics.jsonl"
    process = _trainer(tmp_path, prepared_dir, tokenizer_path, 10_000)
    while process.poll() is None and not (metrics.exists() and len(read_metrics(metrics)) >= 2):
        time.sleep(0.2)
    os.kill(process.pid, signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == contract.RETRY, stderr[-2000:]
    saved = [int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit()]
    assert len(saved) == 1 and saved[0] >= 2
    assert f"preempted: checkpointed step {saved[0]}" in stderr

    restart = _trainer(tmp_path, prepared_dir, tokenizer_path, saved[0] + 2)
    _, stderr = restart.communicate(timeout=300)
    assert restart.returncode == contract.OK, stderr[-2000:]
    steps = [r["step"] for r in read_metrics(metrics)]
    assert steps[-2:] == [saved[0] + 1, saved[0] + 2]
