"""bench.trainer_side --restart: the run is stopped as a preemption stops it and started again in its own
folder, where it resumes from its checkpoint; each start's time to its first step is reported, and the
second start reads the first's programs back from the compilation cache."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_a_restart_resumes_in_the_same_folder_and_reads_the_step_back(tmp_path):
    result = tmp_path / "figures.json"
    run = subprocess.run([sys.executable, "-m", "bench.trainer_side", "--model", "tiny", "--seq-len", "64", "--batch", "8",
                          "--training", "full", "--restart", "--result", str(result), "--workdir", str(tmp_path),
                          f"--trainer-arg=--compilation-cache-dir={tmp_path / 'compiles'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(result.read_text())
    first, second = figures["starts"]
    assert first["start_step"] == 0 and first["restore_s"] == 0
    assert second["start_step"] >= 20 and second["restore_s"] > 0, second  # stopped after half its 40 steps, resumed
    # what came before each first step, by name: the resumed full fine-tune builds no weights, restores them
    assert set(first["spans"]) == {"inputs", "weights", "compile"} and set(second["spans"]) == {"inputs", "weights", "restore", "compile"}
    assert figures["restart_over_first"] == pytest.approx(second["before_first_step_s"] / first["before_first_step_s"])
    assert figures["before_first_step_s"] == first["before_first_step_s"] and figures["reports"] >= 2
    assert first["compilation_cache"].split(": ")[1].startswith("0 programs read back") and "jit(train)" in first["compilation_cache"]
    # the train step and the rest of the first start's programs are read back (a restart compiles only what a
    # first start never runs: restoring's own small programs)
    assert "jit(train)" not in second["compilation_cache"] and not second["compilation_cache"].split(": ")[1].startswith("0 ")
