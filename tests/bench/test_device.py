"""The accelerator benchmark's CPU dry run, as it must run on the accelerator machine: without gemma,
kauldron or TensorFlow (which cannot be brought there), each side in its own process, figures in JSON; the
trainer side restarted as a preemption restarts it (--trainer-restart)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BLOCKER = '''
import sys

BLOCKED = ("gemma", "kauldron", "tensorflow")


class Absent:
    """The import system's finders, except that the packages the accelerator machine lacks are not found."""

    def __init__(self, finders):
        self.finders = finders

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            return None
        for finder in self.finders:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                return spec
        return None

    def invalidate_caches(self):
        for finder in self.finders:
            getattr(finder, "invalidate_caches", lambda: None)()


sys.meta_path[:] = [Absent(list(sys.meta_path))]
'''


def test_the_dry_run_needs_no_gemma_and_writes_both_sides_figures(tmp_path):
    (tmp_path / "blocker").mkdir()
    (tmp_path / "blocker" / "sitecustomize.py").write_text(BLOCKER)
    env = {key: value for key, value in os.environ.items() if key != "JAX_PLATFORMS"}  # the guard chooses
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "blocker"), str(ROOT)])
    blocked = subprocess.run([sys.executable, "-c", "import gemma"], env=env, capture_output=True, text=True)
    assert "No module named 'gemma'" in blocked.stderr
    out = tmp_path / "figures.json"
    run = subprocess.run([sys.executable, "-m", "bench.device", "--dry-run", "--profile", "--out", str(out), "--workdir", str(tmp_path),
                          "--side", "ours", "--side", "baseline", "--side", "trainer", "--training", "full",
                          "--trainer-restart", f"--trainer-arg=--compilation-cache-dir={tmp_path / 'compiles'}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "TPU_WORKER_HOSTNAMES" not in run.stdout + run.stderr
    (case,) = json.loads(out.read_text())["cases"]
    for side in ("ours", "baseline"):
        figures = case["sides"][side]
        assert figures["useful_tokens_per_s"] > 0 and figures["step_s"] > 0, figures
        assert figures["compiled_step_bytes"] > 0
    assert case["ours_over_baseline"] > 0
    assert "ours/baseline, useful tokens/s" in run.stdout
    # python -m trainer itself, as a user starts it, on a chat file: its steady step against ours' at the same batch
    trainer = case["sides"]["trainer"]
    assert trainer["batch"] == case["sides"]["ours"]["batch"] and trainer["reports"] >= 2, trainer
    assert trainer["step_s"] > 0 and trainer["tokens_per_s"] > 0 and trainer["remat"] == case["sides"]["ours"]["remat"]
    assert case["trainer_over_ours"] == pytest.approx(case["sides"]["ours"]["step_s"] / trainer["step_s"])
    assert "python -m trainer / ours, steps per second" in run.stdout
    # --trainer-restart: stopped after half its 40 steps as a preemption stops it, started again in its folder, it
    # resumes from its checkpoint; each start's time to its first step, and what it spent it on, by name
    first, second = trainer["starts"]
    assert first["start_step"] == 0 and first["restore_s"] == 0
    assert second["start_step"] >= 20 and second["restore_s"] > 0, second
    assert set(first["spans"]) == {"inputs", "weights", "compile"} and set(second["spans"]) == {"inputs", "weights", "restore", "compile"}
    assert trainer["restart_over_first"] == pytest.approx(second["before_first_step_s"] / first["before_first_step_s"])
    assert "python -m trainer's restart reached its first step in" in run.stdout
    # the train step and the rest of the first start's programs are read back (a restart compiles only what a
    # first start never runs: restoring's own small programs)
    assert first["compilation_cache"].split(": ")[1].startswith("0 programs read back") and "jit(train)" in first["compilation_cache"]
    assert "jit(train)" not in second["compilation_cache"] and not second["compilation_cache"].split(": ")[1].startswith("0 ")
    # --profile: per side, where a traced step's time went; on the CPU every operation is the step's own
    for side in ("ours", "baseline"):
        rows = {row["category"]: row for row in case["sides"][side]["profile"]}
        assert {"matmuls", "loss head", "optimizer update"} <= set(rows), rows
        assert sum(row["share"] for row in rows.values()) == pytest.approx(1.0, abs=1e-6)
        assert f"tiny @ 64, {side} (full, batch 8): where a step's time goes" in run.stdout
