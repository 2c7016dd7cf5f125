"""Processes of one job that share a fresh workdir (a multi-host slice on the FUSE-mounted bucket):
`--preset tiny` generates its corpus and tokenizer and prepares the data there, once, and every
process reads the same files, never a half-written one.

The processes run `tests/trainer/shared_inputs_run.py`, which enters `trainer.loop.resolve_inputs`
in all of them at the same instant, round after round in new workdirs. Before the trainer prepared
shared inputs on process 0 only, every process wrote the corpus and trained the tokenizer at once:
in this test some process saw a half-written corpus in most rounds (SentencePiece's
"!sentences_.empty()", or tokenizers that differ between processes).
"""

import json
import os
import subprocess
import sys

from tests.trainer.test_distributed import REPO, _free_port

PROCESSES = 3
ROUNDS = 5
TIMEOUT_S = 300


def _resolve_in_every_process(tmp_path, rounds: int, *trainer_args) -> list[tuple[dict, ...]]:
    """What each process saw in each round: [round][process] -> {tokenizer, documents} or {error}."""
    port = _free_port()
    environment = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    records = [tmp_path / f"process{index}.json" for index in range(PROCESSES)]
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.trainer.shared_inputs_run", str(record), str(rounds), str(tmp_path / "run"),
             *trainer_args, "--coordinator-address", f"localhost:{port}", "--num-processes", str(PROCESSES),
             "--process-id", str(index)],
            cwd=REPO, env=environment, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        for index, record in enumerate(records)
    ]
    try:
        stderr = [process.communicate(timeout=TIMEOUT_S)[1] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    for index, (process, text) in enumerate(zip(processes, stderr)):
        assert process.returncode == 0, f"process {index}: exit {process.returncode}\n{text[-3000:]}"
    return list(zip(*(json.loads(record.read_text()) for record in records)))


def test_processes_on_one_fresh_workdir_prepare_once_and_agree_on_the_tokenizer(tmp_path):
    rounds = _resolve_in_every_process(tmp_path, ROUNDS, "--preset", "tiny")
    assert len(rounds) == ROUNDS
    failures = [f"round {r}, process {p}: {seen['error']}" for r, seen_by in enumerate(rounds)
                for p, seen in enumerate(seen_by) if "error" in seen]  # fmt: skip
    assert not failures, "\n".join(failures)
    # One seed, one corpus, one tokenizer: the same file in every process and every round.
    assert {seen["tokenizer"] for seen_by in rounds for seen in seen_by} == {rounds[0][0]["tokenizer"]}
    assert {seen["documents"] for seen_by in rounds for seen in seen_by} == {rounds[0][0]["documents"]}
    leftovers = sorted(path.name for path in (tmp_path / "run").rglob("*") if ".partial" in path.name)
    assert not leftovers, leftovers


def test_a_data_file_that_process_zero_refuses_fails_every_process_with_its_line(tmp_path, tokenizer_path):
    binary = tmp_path / "corpus.txt"
    binary.write_bytes(b"a story\n\x00\x01\x02")
    (seen_by,) = _resolve_in_every_process(tmp_path, 1, "--model", "tiny", "--weights", "random", "--data", str(binary),
                                           "--tokenizer", str(tokenizer_path))  # fmt: skip
    assert {seen["error"] for seen in seen_by} == {
        f"UserError: data file {binary}: binary content (NUL byte near offset 0); pass a UTF-8 text file"
    }
