"""trainer.supervise with real processes: a small Python child that counts its starts in a file and
ends as each test asks (no JAX: the supervisor's logic is the child's exit, whatever the child)."""

import pathlib
import signal
import subprocess
import sys
import time

import pytest

from trainer import contract

ROOT = pathlib.Path(__file__).resolve().parents[2]
# argv: the start counter file, then what each start does, in order (the last one repeats):
# "kill9" (SIGKILL itself), "exit:N", "wait:N" (write ready, then on SIGTERM exit N), or "orphan" (start a
# grandchild that sleeps, as a data loader's worker would, write its pid, then SIGKILL itself).
CHILD = """
import os, pathlib, signal, subprocess, sys, time
counter = pathlib.Path(sys.argv[1])
start = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(start))
plan = sys.argv[2:]
action = plan[min(start, len(plan)) - 1]
if (counter.parent / "worker").exists():  # a later start: is the first one's worker still running?
    stat = pathlib.Path("/proc/" + (counter.parent / "worker").read_text() + "/stat")
    (counter.parent / "worker_at_restart").write_text(stat.read_text().rsplit(")", 1)[1].split()[0] if stat.exists() else "gone")
if action == "orphan":
    # A worker that ignores SIGTERM, as a loader's busy worker may: only SIGKILL ends it for sure.
    worker = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                               "open(__import__('sys').argv[1], 'w').close(); time.sleep(120)", str(counter.parent / "armed")])
    while not (counter.parent / "armed").exists():
        time.sleep(0.01)
    (counter.parent / "worker").write_text(str(worker.pid))
    action = "kill9"
if action == "orphan_ends":  # a helper whose own child outlives it briefly, while this trainer runs on
    helper = subprocess.run(["sh", "-c", "sleep 0.3 & echo $!"], capture_output=True, text=True)
    orphan = helper.stdout.strip()
    time.sleep(2)
    stat = pathlib.Path("/proc/" + orphan + "/stat")
    state = stat.read_text().rsplit(")", 1)[1].split()[0] if stat.exists() else "gone"
    (counter.parent / "orphan_after_it_ended").write_text(state)
    sys.exit(0)
if action == "kill9":
    os.kill(os.getpid(), signal.SIGKILL)
if action.startswith("exit:"):
    sys.exit(int(action[5:]))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(int(action[5:])))
(counter.parent / "ready").write_text("")
time.sleep(60)
"""


def _supervise(tmp_path, *plan, restarts=3, window=3600) -> subprocess.Popen:
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    command = [sys.executable, "-m", "trainer.supervise", "--restarts", str(restarts), "--pause", "0",
               "--restart-window", str(window), "--",
               sys.executable, str(child), str(tmp_path / "starts"), *plan]
    return subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)


def _starts(tmp_path) -> int:
    return int((tmp_path / "starts").read_text())


def test_a_child_killed_by_sigkill_is_restarted_in_place(tmp_path):
    supervisor = _supervise(tmp_path, "kill9", "exit:0")
    _, stderr = supervisor.communicate(timeout=30)
    assert supervisor.returncode == contract.OK and _starts(tmp_path) == 2
    assert "the trainer was killed by SIGKILL; restarting it in this pod, attempt 1 of 3" in stderr


def test_a_crash_code_is_restarted_too(tmp_path):
    supervisor = _supervise(tmp_path, "exit:1", "exit:0")
    _, stderr = supervisor.communicate(timeout=30)
    assert supervisor.returncode == contract.OK and _starts(tmp_path) == 2
    assert "exited with code 1; restarting it in this pod, attempt 1 of 3" in stderr


@pytest.mark.parametrize("code", [contract.USER_ERROR, contract.RETRY])
def test_a_user_error_or_a_retry_is_not_restarted_and_its_code_is_the_supervisors(tmp_path, code):
    supervisor = _supervise(tmp_path, f"exit:{code}", "exit:0")
    _, stderr = supervisor.communicate(timeout=30)
    assert supervisor.returncode == code and _starts(tmp_path) == 1 and "restarting" not in stderr


# RETRY: the trainer saved on the notice; 1: it failed on its way out, which is not restarted either.
@pytest.mark.parametrize("code", [contract.RETRY, 1])
def test_sigterm_is_forwarded_and_nothing_is_restarted(tmp_path, code):
    supervisor = _supervise(tmp_path, f"wait:{code}", "exit:0")
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline and supervisor.poll() is None, "the child never started"
        time.sleep(0.05)
    supervisor.send_signal(signal.SIGTERM)
    _, stderr = supervisor.communicate(timeout=30)
    # The child's handler ran (its code, not 128+15 for a child the signal killed), and it was not started again.
    assert supervisor.returncode == code and _starts(tmp_path) == 1 and "restarting" not in stderr


def test_after_n_restarts_the_childs_code_is_the_supervisors(tmp_path):
    supervisor = _supervise(tmp_path, "kill9", restarts=2)
    _, stderr = supervisor.communicate(timeout=30)
    assert supervisor.returncode == 128 + signal.SIGKILL and _starts(tmp_path) == 3
    assert [line.split("attempt ")[1] for line in stderr.splitlines() if "restarting" in line] == [
        "1 of 2 within 3600 s", "2 of 2 within 3600 s"]


def test_the_budget_counts_only_the_crashes_within_the_window(tmp_path):
    """Before, the budget never reset: a run that crashed once a day ran out of restarts in a few days."""
    supervisor = _supervise(tmp_path, "kill9", "kill9", "kill9", "exit:0", restarts=1, window=0)
    _, stderr = supervisor.communicate(timeout=30)
    assert supervisor.returncode == contract.OK and _starts(tmp_path) == 4, stderr


@pytest.mark.parametrize("argv, line", [
    (["--pause", "nan", "--", "true"], "argument --pause: expected a finite number >= 0, got 'nan'"),
    (["--pause", "-1", "--", "true"], "argument --pause: expected a finite number >= 0, got '-1'"),
    # time.sleep's OverflowError after the first crash, a traceback instead of the restart.
    (["--pause", "1e10", "--", "true"], "argument --pause: expected at most 86400 seconds, got '1e10'"),
    (["--restarts", "-1", "--", "true"], "argument --restarts: expected an integer >= 0, got '-1'"),
    (["--", "/nonexistent/cmd"], "cannot start /nonexistent/cmd: No such file or directory"),
])
def test_a_bad_argument_or_command_is_one_line(argv, line, capsys):
    from trainer.supervise import main

    assert main(argv) == contract.USER_ERROR
    (printed,) = capsys.readouterr().err.splitlines()
    assert printed.startswith(f"trainer.supervise: error: {line}")


def test_an_orphan_that_ends_while_the_trainer_runs_is_reaped_at_once(tmp_path):
    """The supervisor is the container's first process (here: the trainer's subreaper): a process the trainer's
    children left behind falls to it when it ends, and stayed a zombie until the trainer itself ended."""
    supervisor = _supervise(tmp_path, "orphan_ends", restarts=0)
    supervisor.communicate(timeout=30)
    assert supervisor.returncode == contract.OK
    assert (tmp_path / "orphan_after_it_ended").read_text() == "gone"


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (not gone, not a zombie waiting for its parent)."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_what_a_crashed_trainer_left_running_is_killed_before_the_restart(tmp_path):
    supervisor = _supervise(tmp_path, "orphan", "exit:0")
    supervisor.communicate(timeout=30)
    assert supervisor.returncode == contract.OK and _starts(tmp_path) == 2
    # When the restarted trainer starts, the worker is gone or a zombie of the killed group (Z), not running.
    assert (tmp_path / "worker_at_restart").read_text() in ("gone", "Z")
    assert not _running(int((tmp_path / "worker").read_text()))
