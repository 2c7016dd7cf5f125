"""Several local processes as one job: the real trainer CLI (`tests/trainer/distributed_run.py` around
`python -m trainer`) on the tiny model, 2 CPU devices per process, compared with 1 process x 4 devices.

The runs are module fixtures shared by the tests. They start from the same weights (`--weights`, drawn
with numpy: jitting the model's own init costs ~15 s of compilation on 2 cores) and share a JAX
compilation cache, so that a run spends its seconds on training rather than on compiling what an
earlier run already compiled.
"""

import dataclasses
import json
import os
import pathlib
import shutil
import signal
import socket
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
from trainer.model import models
from trainer.run import checkpoint
from trainer.run.metrics import read_metrics
from trainer.data.tokenizer import load_tokenizer
from workloads.__main__ import render_config, render_specs

REPO = pathlib.Path(__file__).parents[2]
DEVICES = 4
STEPS = 12
# FSDP over all devices: every process holds (and checkpoints) only its half of each large array.
FSDP_MESH = f"data=1,fsdp={DEVICES}"
# Other processes, other float32 reduction orders: AdamW turns tiny gradient differences into
# differences of a fraction of a percent of how far a weight moved (observed: 0.29% for 2 processes,
# 0.78% for 2 slices; losses within 1e-6). A missing all-reduce or a wrong row would be of the order
# of the move itself. The runs compute in float32: in bfloat16 (the trainer's choice on CPUs with
# native bfloat16) the same reordering already moved the weights apart by 65% of the move.
RELATIVE_TOLERANCE = 0.05
RUN_TIMEOUT_S = 600


@dataclasses.dataclass
class Run:
    workdir: pathlib.Path
    records: list[dict]  # one per process, written by distributed_run
    stderr: list[str]
    stdout: str = ""  # process 0's

    @property
    def params(self):
        return gm.ckpts.load_params(self.workdir / "export" / "params")

    @property
    def losses(self) -> dict[int, float]:
        return {r["step"]: r["loss"] for r in read_metrics(self.workdir / "metrics.jsonl") if "loss" in r}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


class Job:
    """`processes` local trainer processes forming one JAX job, DEVICES CPU devices in all. "{process}" in
    an argument is each process's index; `join=False`: no coordinator flags (the processes find the job
    through the multi-tier volume's jax-init-info.txt)."""

    def __init__(self, workdir, processes: int, trainer_args: list[str], *, cache_dir, env=None, join=True):
        self.workdir = pathlib.Path(workdir)
        port = _free_port()
        environment = {
            **os.environ, **(env or {}),
            "PYTHONPATH": str(REPO),
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES // processes}",
            "JAX_COMPILATION_CACHE_DIR": str(cache_dir),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        }  # fmt: skip
        self.record_paths = [self.workdir.with_name(f"{self.workdir.name}.process{i}.json") for i in range(processes)]
        self.stdout_path = self.workdir.with_name(f"{self.workdir.name}.stdout")  # process 0's reports
        self.processes = []
        for index, record in enumerate(self.record_paths):
            distributed = ["--coordinator-address", f"localhost:{port}", "--num-processes", str(processes),
                           "--process-id", str(index)] if processes > 1 and join else []  # fmt: skip
            own_args = [arg.replace("{process}", str(index)) for arg in trainer_args]
            command = [sys.executable, "-m", "tests.trainer.distributed_run", str(record), *own_args, *distributed]
            with self.stdout_path.open("w") if index == 0 else open(os.devnull, "w") as stdout:
                self.processes.append(subprocess.Popen(command, cwd=REPO, env=environment, text=True,
                                                       stdout=stdout, stderr=subprocess.PIPE))  # fmt: skip

    def wait(self, expected_code: int = contract.OK) -> Run:
        try:
            stderr = [process.communicate(timeout=RUN_TIMEOUT_S)[1] for process in self.processes]
        finally:  # a process left hanging by a failed peer must not outlive the test
            for process in self.processes:
                if process.poll() is None:
                    process.kill()
        for index, (process, text) in enumerate(zip(self.processes, stderr)):
            assert process.returncode == expected_code, f"process {index}: exit {process.returncode}\n{text[-3000:]}"
        return Run(self.workdir, [json.loads(path.read_text()) for path in self.record_paths], stderr,
                   self.stdout_path.read_text())


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("distributed")


@pytest.fixture(scope="module")
def initial_weights(runs_dir, tokenizer_path):
    """(path for --weights, params): small random weights of the tiny model, exported like a checkpoint."""
    config = models.model_config("tiny", vocab_size=load_tokenizer(str(tokenizer_path)).vocab_size)
    rng = np.random.default_rng(0)
    shapes = jax.eval_shape(lambda: models.init_params(config, seed=0))
    params = jax.tree.map(lambda leaf: (0.02 * rng.standard_normal(leaf.shape)).astype(leaf.dtype), shapes)
    return checkpoint.export_params(params, runs_dir / "init"), params


@pytest.fixture(scope="module")
def launch(runs_dir, initial_weights, prepared_dir, tokenizer_path):
    """launch(name, processes, *flags, env=None) -> Job: STEPS steps from the initial weights."""
    weights, _ = initial_weights

    def start(name, processes, *flags, env=None, join=True) -> Job:
        args = tiny_args(runs_dir / name, prepared_dir, tokenizer_path, "--weights", weights, "--steps", str(STEPS),
                         "--lr", "3e-3", "--eval-fraction", "0", "--no-samples", "--log-interval", "1",
                         "--checkpoint-interval", "1000", "--compute-dtype", "float32", *flags)  # fmt: skip
        return Job(runs_dir / name, processes, args, cache_dir=runs_dir / "jax_cache", env=env, join=join)

    return start


@pytest.fixture(scope="module")
def one_process(launch) -> Run:
    return launch("one_process", 1, "--mesh", FSDP_MESH).wait()


@pytest.fixture(scope="module")
def two_processes(launch) -> Run:
    return launch("two_processes", 2, "--mesh", FSDP_MESH).wait()


def _max_difference(a, b) -> float:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _assert_same_training(run: Run, reference: Run, initial_params) -> None:
    """The same parameters (and losses) as the reference after STEPS steps."""
    moved, difference = _max_difference(reference.params, initial_params), _max_difference(run.params, reference.params)
    print(f"{run.workdir.name}: parameters differ by at most {difference:.2e}, {difference / moved:.2%} of the largest move")
    assert difference <= RELATIVE_TOLERANCE * moved
    assert sorted(run.losses) == list(range(1, STEPS + 1))
    assert run.losses == pytest.approx(reference.losses, abs=1e-5)


def _assert_each_process_fed_its_half_of_the_global_batches(run: Run, reference: Run) -> None:
    (whole,) = [record["batches"] for record in reference.records]
    first, second = [record["batches"] for record in run.records]
    assert len(first) == len(second) == len(whole) == STEPS
    for step_rows, rows_0, rows_1 in zip(whole, first, second):
        assert rows_0 + rows_1 == step_rows  # process p holds rows [p*B/2, (p+1)*B/2) of the global batch
        assert not {tuple(row) for row in rows_0} & {tuple(row) for row in rows_1}


def test_two_processes_see_four_devices_read_disjoint_rows_and_train_like_one(one_process, two_processes, initial_weights):
    for index, record in enumerate(two_processes.records):
        assert (record["process_index"], record["process_count"]) == (index, 2)
        assert (record["device_count"], record["local_device_count"]) == (DEVICES, DEVICES // 2)
        assert [set(row) for row in record["mesh_processes"]] == [{0, 1}]  # fsdp spans both processes
    assert one_process.records[0]["device_count"] == DEVICES
    _assert_each_process_fed_its_half_of_the_global_batches(two_processes, one_process)
    _assert_same_training(two_processes, one_process, initial_weights[1])


def test_two_emulated_slices_put_data_parallelism_on_dcn_and_train_like_one_process(one_process, launch, initial_weights):
    # The slice count as the multislice stack's workload hands it to the trainer.
    slices_env = {"MEGASCALE_NUM_SLICES": render_specs(render_config("multislice"))[0].trainer_env["MEGASCALE_NUM_SLICES"]}
    slices = int(slices_env["MEGASCALE_NUM_SLICES"])
    assert slices == 2
    run = launch("two_slices", slices, "--mesh", f"data={slices},fsdp=-1", env=slices_env).wait()
    for record in run.records:
        assert record["mesh_axes"] == ["data", "fsdp"]
        # Along data (DCN): one slice (here a process) per index; along fsdp (ICI): one slice only.
        assert [set(row) for row in record["mesh_processes"]] == [{slice_index} for slice_index in range(slices)]
    _assert_each_process_fed_its_half_of_the_global_batches(run, one_process)
    _assert_same_training(run, one_process, initial_weights[1])


def _assert_every_process_wrote_its_half(checkpoint_dir: pathlib.Path, *, processes: int) -> None:
    """Orbax's multi-host layout: each process's array shards under state/ocdbt.process_I, its data
    iterator position in data/process_I-of-N.json."""
    shard_bytes = [sum(f.stat().st_size for f in (checkpoint_dir / "state" / f"ocdbt.process_{i}").rglob("*") if f.is_file())
                   for i in range(processes)]  # fmt: skip
    assert min(shard_bytes) > 0.9 * max(shard_bytes), shard_bytes  # FSDP over all devices: equal halves
    for index in range(processes):
        assert (checkpoint_dir / "data" / f"process_{index}-of-{processes}.json").is_file()


def _checkpointed_steps(run_dir: pathlib.Path) -> list[int]:
    return sorted(int(path.name) for path in (run_dir / "checkpoints").iterdir() if path.name.isdigit())


def test_sigterm_to_one_process_checkpoints_both_at_one_step_and_the_relaunch_finishes_like_a_straight_run(
    two_processes, launch
):
    job = launch("preempted", 2, "--mesh", FSDP_MESH)
    metrics = job.workdir / "metrics.jsonl"
    while all(p.poll() is None for p in job.processes) and not (metrics.exists() and read_metrics(metrics)):
        time.sleep(0.1)
    job.processes[1].send_signal(signal.SIGTERM)  # process 1 only; process 0 learns it from the job
    preempted = job.wait(contract.RETRY)
    (step,) = _checkpointed_steps(job.workdir)
    assert 1 <= step < STEPS
    for text in preempted.stderr:
        assert f"preempted: checkpointed step {step}, restart to resume" in text
    _assert_every_process_wrote_its_half(job.workdir / "checkpoints" / str(step), processes=2)

    resumed = launch("preempted", 2, "--mesh", FSDP_MESH).wait()
    assert _checkpointed_steps(job.workdir) == [step, STEPS]
    assert [len(record["batches"]) for record in resumed.records] == [STEPS - step] * 2
    assert _max_difference(resumed.params, two_processes.params) == 0
    assert resumed.losses == pytest.approx(two_processes.losses, abs=1e-6)


# The local tier (trainer.run.local_checkpoints): a local save every LOCAL_INTERVAL steps, a persistent
# one every PERSISTENT_INTERVAL; process 1 is SIGKILLed the moment its local step KILLED_AFTER is
# complete (tests/trainer/distributed_run.py), after the persistent step 7 and before the next.
LOCAL_INTERVAL, PERSISTENT_INTERVAL, KILLED_AFTER = 2, 7, 10


def _local_args(run_dir: pathlib.Path) -> tuple[str, ...]:
    return ("--mesh", FSDP_MESH, "--local-checkpoint-dir", str(run_dir.with_name(f"{run_dir.name}.local")),
            "--local-checkpoint-interval", str(LOCAL_INTERVAL), "--checkpoint-interval", str(PERSISTENT_INTERVAL))


def _kill_after_a_local_save(launch, runs_dir: pathlib.Path, name: str) -> tuple[pathlib.Path, int]:
    """Runs until process 1 kills itself after its local save of KILLED_AFTER, then SIGKILLs process 0
    once its own save of that step is complete. (the local tier, the last step process 0 reported)."""
    job = launch(name, 2, *_local_args(runs_dir / name), env={"KILL_AFTER_LOCAL_STEP": str(KILLED_AFTER)})
    local = job.workdir.with_name(f"{name}.local")
    return local, _kill_when(job, lambda: (local / "process-0" / str(KILLED_AFTER) / "meta.json").exists())


def _kill_when(job: Job, process_0_saved) -> int:
    """Waits for process 1 to kill itself (KILL_AFTER_LOCAL_STEP), then SIGKILLs process 0 once
    `process_0_saved()`; the last step process 0 reported."""
    try:
        assert job.processes[1].wait(timeout=RUN_TIMEOUT_S) == -signal.SIGKILL, job.processes[1].stderr.read()[-3000:]
        deadline = time.monotonic() + 60
        while not process_0_saved():
            assert time.monotonic() < deadline and job.processes[0].poll() is None, "process 0 saved no local step"
            time.sleep(0.05)
    finally:
        for process in job.processes:
            process.kill()
            process.wait()
    return max(record["step"] for record in read_metrics(job.workdir / "metrics.jsonl") if "loss" in record)


def _assert_every_step_trained_like_the_straight_run(run: Run, reference: Run, *, resumed_from: int) -> None:
    """Every record (of both attempts) has the straight run's batch and loss; the restart fed STEPS - resumed_from
    batches and ended with the straight run's parameters."""
    want = {r["step"]: r for r in read_metrics(reference.workdir / "metrics.jsonl") if "loss" in r}
    records = [r for r in read_metrics(run.workdir / "metrics.jsonl") if "loss" in r]
    assert {r["step"] for r in records} == set(range(1, STEPS + 1))
    for record in records:
        assert record["batch"] == want[record["step"]]["batch"], record["step"]
        assert record["loss"] == pytest.approx(want[record["step"]]["loss"], abs=1e-6), record["step"]
    assert [len(record["batches"]) for record in run.records] == [STEPS - resumed_from] * 2
    assert _max_difference(run.params, reference.params) == 0


def test_sigkill_after_a_local_save_resumes_both_processes_from_the_local_tier(two_processes, launch, runs_dir):
    local, reached = _kill_after_a_local_save(launch, runs_dir, "local_killed")
    # What a kill in the middle of a later save leaves (a temporary never renamed, even one written
    # whole) and a step directory without its completeness marker: neither is ever restored.
    identity = json.loads((local / "process-0" / str(KILLED_AFTER) / "meta.json").read_text())["identity"]
    for process in ("process-0", "process-1"):
        shutil.copytree(local / process / str(KILLED_AFTER), local / process / f".partial-{STEPS}-{identity}-dead")
    if not (local / "process-0" / str(STEPS)).exists():
        shutil.copytree(local / "process-0" / str(KILLED_AFTER), local / "process-0" / str(STEPS))
    (local / "process-0" / str(STEPS) / "meta.json").unlink()

    resumed = launch("local_killed", 2, *_local_args(runs_dir / "local_killed")).wait()
    assert f"resuming from the checkpoint of step {KILLED_AFTER} in {local} (local tier)" in resumed.stdout, resumed.stdout
    assert reached - KILLED_AFTER <= LOCAL_INTERVAL
    assert f"step {STEPS} of process 0 is not complete" in resumed.stderr[0]
    _assert_every_step_trained_like_the_straight_run(resumed, two_processes, resumed_from=KILLED_AFTER)
    breakdown = assert_accounts_for_the_wall_time(resumed.workdir, attempts=2)  # prints the table (pytest -s)
    assert breakdown.seconds["UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"] > 0


def test_a_process_whose_local_tier_is_gone_makes_the_job_resume_from_the_persistent_tier(two_processes, launch, runs_dir):
    local, _ = _kill_after_a_local_save(launch, runs_dir, "local_lost")
    persistent = _checkpointed_steps(runs_dir / "local_lost")
    assert persistent in ([], [PERSISTENT_INTERVAL])  # the kill may have cut Orbax's save of step 7 short
    shutil.rmtree(local / "process-1")  # a replaced host: no peer-to-peer copy, the step is incomplete

    resumed = launch("local_lost", 2, *_local_args(runs_dir / "local_lost")).wait()
    _assert_resumed_from_the_persistent_tier_like_the_straight_run(resumed, two_processes, persistent)
    assert_accounts_for_the_wall_time(resumed.workdir, attempts=2)


def _assert_resumed_from_the_persistent_tier_like_the_straight_run(resumed: Run, reference: Run, persistent: list[int]) -> None:
    """The relaunch resumed from the persistent tier's step (or, where the kill cut that save short, from the
    start), and trained every step like the straight run."""
    if persistent:
        assert f"resuming from the checkpoint of step {PERSISTENT_INTERVAL} in {resumed.workdir / 'checkpoints'} " \
               "(persistent tier)" in resumed.stdout, resumed.stdout
    else:
        assert "resuming" not in resumed.stdout, resumed.stdout
    _assert_every_step_trained_like_the_straight_run(resumed, reference, resumed_from=persistent[-1] if persistent else 0)


# GKE's multi-tier checkpointing (trainer.multitier.replicated) on the replicator stand-in
# (tests/trainer/replicator_stand_in.py): each process's --local-checkpoint-dir is its node's volume,
# VOLUMES/node-<i>, which outlives the processes; one start of the stand-in serves one attempt.
MULTI_TIER_JOB = "mtc-test"


class _StandIn:
    """The node side for one attempt: started before the trainer's processes, stopped after them."""

    def __init__(self, volumes: pathlib.Path):
        self.log = volumes.with_name(f"{volumes.name}.stand-in.log")
        with self.log.open("a") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "tests.trainer.replicator_stand_in", str(volumes), "2"],
                                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=log,
                                            stderr=subprocess.STDOUT)

    def stop(self) -> str:
        self.process.terminate()
        self.process.wait(timeout=30)
        return self.log.read_text()


def _multi_tier(launch, runs_dir: pathlib.Path, name: str, *, kill_after: int | None = None) -> tuple[Job, _StandIn]:
    volumes = runs_dir / f"{name}.volumes"
    stand_in = _StandIn(volumes)
    env = {"JOBSET_NAME": MULTI_TIER_JOB, "STAND_IN_PROCESSES": "2", **({"KILL_AFTER_LOCAL_STEP": str(kill_after)} if kill_after else {})}
    job = launch(name, 2, "--mesh", FSDP_MESH, "--local-checkpoint-dir", str(volumes / "node-{process}"),
                 "--multi-tier-backup-minutes", "30", "--local-checkpoint-interval", str(LOCAL_INTERVAL),
                 "--checkpoint-interval", str(PERSISTENT_INTERVAL), env=env, join=False)
    return job, stand_in


def _kill_after_a_multi_tier_save(launch, runs_dir: pathlib.Path, name: str) -> pathlib.Path:
    """Both processes SIGKILLed (a pod recreation) after their save of KILLED_AFTER reached the stand-in."""
    job, stand_in = _multi_tier(launch, runs_dir, name, kill_after=KILLED_AFTER)
    volumes = runs_dir / f"{name}.volumes"
    stored = lambda node: (volumes / f"node-{node}" / f"{MULTI_TIER_JOB}-s{KILLED_AFTER}-n{node}-w0.meta").exists()  # noqa: E731
    try:
        _kill_when(job, lambda: stored(0) and stored(1))
    finally:
        log = stand_in.stop()
    assert f"node 1: stored step {KILLED_AFTER}" in log, log
    return volumes


def test_multi_tier_a_pod_recreation_resumes_from_the_step_the_replicator_restores(two_processes, launch, runs_dir):
    volumes = _kill_after_a_multi_tier_save(launch, runs_dir, "multi_tier_killed")
    job, stand_in = _multi_tier(launch, runs_dir, "multi_tier_killed")
    try:
        resumed = job.wait()
    finally:
        log = stand_in.stop()
    assert f"node 0: restore step {KILLED_AFTER}" in log and f"node 1: restore step {KILLED_AFTER}" in log, log
    assert f"resuming from the checkpoint of step {KILLED_AFTER} in {volumes / 'node-0'} (local tier)" in resumed.stdout, resumed.stderr
    _assert_every_step_trained_like_the_straight_run(resumed, two_processes, resumed_from=KILLED_AFTER)


def test_multi_tier_a_lost_volume_resumes_from_the_persistent_tier(two_processes, launch, runs_dir):
    volumes = _kill_after_a_multi_tier_save(launch, runs_dir, "multi_tier_lost")
    persistent = _checkpointed_steps(runs_dir / "multi_tier_lost")
    assert persistent in ([], [PERSISTENT_INTERVAL])  # the kill may have cut Orbax's save of step 7 short
    shutil.rmtree(volumes / "node-1")  # a replaced node: its RAM disk is gone, and the stand-in copies from no peer

    job, stand_in = _multi_tier(launch, runs_dir, "multi_tier_lost")
    try:
        resumed = job.wait()
    finally:
        log = stand_in.stop()
    assert "node 1: nothing to restore" in log, log
    _assert_resumed_from_the_persistent_tier_like_the_straight_run(resumed, two_processes, persistent)
