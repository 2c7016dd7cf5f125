"""A lone TPU host (no cluster) whose cluster detection fails in any way, here with the ConnectionError of a
metadata server that cannot be reached, trains as one process after one notice line; `--num-processes 1`
starts one process without asking. Before, the ConnectionError was a 60-line traceback before the first step."""

import os
import subprocess
import sys

import pytest

from tests.trainer.test_bad_inputs import REPO
from trainer import contract


def _train(tmp_path, tokenizer_path, prepared_dir, *flags) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tests.trainer.run.lone_host_run", "--model", "tiny", "--weights", "random", "--tokenizer",
         str(tokenizer_path), "--data", str(prepared_dir), "--workdir", str(tmp_path / "run"), "--steps", "1",
         "--seq-len", "32", "--batch-size", "4", "--eval-fraction", "0", "--no-samples", *flags],
        cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("flags, notice", [((), True), (("--num-processes", "1"), False)])
def test_a_lone_host_trains_as_one_process(flags, notice, tmp_path, tokenizer_path, prepared_dir):
    done = _train(tmp_path, tokenizer_path, prepared_dir, *flags)
    assert done.returncode == contract.OK, done.stderr
    assert "Traceback" not in done.stderr
    notices = [line for line in done.stderr.splitlines() if line.startswith("trainer: notice:")]
    if notice:
        assert notices == ["trainer: notice: no cluster detected (ConnectionError: HTTPConnectionPool(host='metadata."
                           "google.internal', port=80): Max retries exceeded with url: /computeMetadata/v1/instance/"
                           "attributes/agent-worker-number (Caused by NameResolutionError: Failed to resolve "
                           "'metadata.google.internal')); training as one process on this host (--num-processes 1 skips "
                           "the detection; --coordinator-address, --num-processes and --process-id join a cluster)"]
    else:  # no detection at all: the metadata server is never asked
        assert notices == []
    assert (tmp_path / "run" / "export").is_dir()


def test_without_a_local_socket_one_process_trains_without_the_preemption_service(monkeypatch, capsys):
    """A sandboxed host that allows no socket (the lent TPU machine): the preemption service's coordinator cannot
    listen, so the run goes on as one process without it, said in one line, rather than a traceback."""
    from trainer.run import mesh

    def no_socket():
        raise OSError(97, "Address family not supported by protocol")

    monkeypatch.setattr(mesh, "_free_port", no_socket)
    assert mesh.initialize_distributed(coordinator_address=None, num_processes=1, process_id=None) is False
    assert capsys.readouterr().err == ("trainer: notice: no local socket for the preemption service ([Errno 97] Address "
                                       "family not supported by protocol); training without it: a SIGTERM stops this "
                                       "run without a checkpoint\n")
