"""`python -m workloads fit`: each run is compiled with the trainer options its Job or JobSet carries,
for its own slice shape and number of slices; a run that does not fit is one line that says by how
much and what to change, and the command exits 2. (The compile itself: tests/trainer/measure.)"""

import subprocess
import sys

import pytest

from tests import gcs_stand_in
from tests.workloads.conftest import IMAGE, REPO, edited_config, spec_of, stack_config
from trainer.contract import USER_ERROR
from trainer.measure import compiled
from workloads import fit

pytest.importorskip("libtpu", reason="libtpu is in requirements-dev.lock: run `make setup`")


class _Compiles:
    """Stands in for trainer.measure.compiled.fit, recording what each run would be compiled with
    (the compile of a real model takes minutes; the tiny model's is tested in tests/trainer/measure)."""

    def __init__(self):
        self.calls = []

    def __call__(self, config, devices, *, num_slices, search_batch, compare_splits):
        self.calls.append((config, devices, num_slices))
        return _Report({"fits": True})


class _Report:
    def __init__(self, report):
        self._report = report

    def report(self):
        return dict(self._report)


@pytest.mark.parametrize("stack, chips, slices", [("dev", 1, 1), ("multihost", 8, 1), ("multislice", 16, 2)])
def test_each_run_is_compiled_with_its_jobs_options_for_its_slices(monkeypatch, stack, chips, slices):
    compiles = _Compiles()
    monkeypatch.setattr(compiled, "fit", compiles)
    config = stack_config(stack)
    fits = fit.fit_runs(config, image=IMAGE)
    assert [f.run for f in fits] == [run.name for run in config.runs]
    for (train_config, devices, num_slices), run in zip(compiles.calls, config.runs):
        training = run.training
        assert (train_config.model, train_config.seq_len, train_config.batch_size, train_config.lora_rank) == (
            training.model, training.seq_len, training.batch_size, training.lora_rank)
        assert train_config.mesh == {"data": -1, "fsdp": config.slice.chips}  # FSDP inside a slice, as the Job says
        assert len(devices) == chips and num_slices == slices and devices[0].device_kind == "TPU v6 lite"


def test_a_stacks_fsdp_group_reaches_the_job_and_fit(monkeypatch):
    """gemma-tpu:training.fsdp below the slice's chips: the Job's --mesh and so the compile use it; the
    run is another run (its name changes), a stack that sets none keeps its runs' names."""
    compiles = _Compiles()
    monkeypatch.setattr(compiled, "fit", compiles)
    config = edited_config("multihost", training={"fsdp": 4})
    fit.fit_runs(config, image=IMAGE)
    assert compiles.calls[0][0].mesh == {"data": -1, "fsdp": 4}
    assert spec_of(config).name != spec_of(stack_config("multihost")).name


def test_splits_name_the_fastest_group_that_fits():
    report = {"run": "r", "topology": "2x4", "splits": [
        {"mesh": {"data": -1, "fsdp": 8}, "fits": True, "compiled_bytes_per_chip": 20 * 2**30, "step_time_bound_s": 0.3,
         "bound_by": "bytes", "mfu_bound": 0.3, "ici_bytes_per_chip": 9e9},
        {"mesh": {"data": -1, "fsdp": 1}, "fits": False, "compiled_bytes_per_chip": 40 * 2**30}], "best_mesh": {"data": -1, "fsdp": 8}}
    lines = fit.splits_table([report]).splitlines()
    assert "fsdp=8: 20.00 GiB/chip, 300.0 ms bound by bytes, MFU bound 30%, 9.0 GB over ICI" in lines[2]
    assert lines[3].endswith("fsdp=1: 40.00 GiB/chip, does not fit")
    assert lines[4].endswith("fastest that fits: set gemma-tpu:training fsdp: 8")


def test_the_queued_stack_compiles_each_of_its_runs_with_its_own_settings(monkeypatch):
    compiles = _Compiles()
    monkeypatch.setattr(compiled, "fit", compiles)
    config = stack_config("queued")
    fit.fit_runs(config, image=IMAGE)
    assert [c.lora_rank for c, _, _ in compiles.calls] == [run.training.lora_rank for run in config.runs]
    assert [len(devices) for _, devices, _ in compiles.calls] == [8 * run.slices for run in config.runs]
    compiles.calls.clear()
    only = config.runs[-1].name
    assert [f.run for f in fit.fit_runs(config, image=IMAGE, run_name=only)] == [only]


def test_an_unknown_run_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, "-m", "workloads", "fit", "--stack", "queued", "--run", "nope"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == USER_ERROR
    assert done.stderr.strip().splitlines()[-1].startswith("error: --run nope: the stack has no such run (its runs: ")


def test_fit_of_a_run_that_does_not_fit_is_one_line_and_exit_2(tmp_path):
    """gemma3-12b full fine-tune on one v6e chip, as a user's stack would ask for it, through the command
    itself and the real compiler: its weights and AdamW moments alone exceed the chip (no step compile
    is needed to say so), and the answer is one line that says by how much."""
    stack = tmp_path / "Pulumi.big.yaml"
    stack.write_text((REPO / "Pulumi.dev.yaml").read_text() + "  gemma-tpu:training:\n    model: gemma3-12b\n")
    done = subprocess.run([sys.executable, "-m", "workloads", "fit", "--stack", str(stack), "--quiet", "--cache-dir",
                           str(tmp_path / "compiles")], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == USER_ERROR
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: run gemma-finetune: does not fit v6e 1x1 x 1: the step needs 131.")
    assert "[0:" not in done.stderr  # --quiet: no progress lines


def test_a_run_that_does_not_fit_gets_by_how_much_and_what_to_change():
    report = {"run": "sweep", "accelerator": "v6e", "topology": "2x4", "slices": 1, "lora_rank": 0, "fits": False,
              "compiled_bytes_per_chip": 40 * 2**30, "usable_hbm_bytes_per_chip": int(31.24 * 2**30), "largest_batch": 48,
              "largest_batch_remat": "full"}
    line = fit.advice(report)
    assert "\n" not in line
    assert line.startswith("run sweep: does not fit v6e 2x4 x 1: the step needs 40.0 GiB per chip, the compiler allows "
                           "31.24 GiB (8.8 GiB over)")
    assert "batchSize 48 or less (it fits with remat full)" in line and "loraRank" in line and "larger topology" in line
    assert "batchSize" not in fit.advice({**report, "largest_batch": 0})
    lean = fit.advice({**report, "lean_precision": "lean", "lean_fits": True, "lean_compiled_bytes_per_chip": 24 * 2**30})
    assert "set gemma-tpu:training precision lean (bfloat16 weights and AdamW state: 24.0 GiB per chip, which fits" in lean
    factored = fit.advice({**report, "lean_precision": "lean-factored", "lean_fits": True, "lean_compiled_bytes_per_chip": 24 * 2**30})
    assert "set gemma-tpu:training precision lean-factored (bfloat16 weights and AdamW state, the second moment factored: " \
           "24.0 GiB per chip, which fits" in factored
    assert "precision lean" not in fit.advice({**report, "lean_precision": "lean-factored", "lean_fits": False,
                                                "lean_compiled_bytes_per_chip": 40 * 2**30})
    assert "loraRank" not in fit.advice({**report, "lora_rank": 8})


def test_a_run_that_fits_is_told_what_its_figure_covers():
    report = {"run": "sweep", "accelerator": "v5e", "topology": "1x1", "slices": 1, "fits": True,
              "compiled_bytes_per_chip": int(14.27 * 2**30), "usable_hbm_bytes_per_chip": int(15.75 * 2**30)}
    line = fit.verdict(report)
    assert line.startswith("run sweep: fits v5e 1x1 x 1: 14.27 of 15.75 GiB per chip (1.48 free); that is all the run "
                           "keeps on a chip: the training state, frozen weights and batch")
    assert "\n" not in line


@pytest.mark.parametrize("speedup, named", [(1.4, True), (1.05, False)])
def test_a_run_that_fits_is_told_of_a_faster_precision_that_fits(speedup, named):
    """The verdict names lean-factored where the compiler's figures put it at least 10% ahead (their bound is not
    the step's time: less is noise), with the stack key that sets it."""
    report = {"run": "sweep", "accelerator": "v6e", "topology": "2x4", "slices": 1, "fits": True,
              "compiled_bytes_per_chip": int(20 * 2**30), "usable_hbm_bytes_per_chip": int(31.25 * 2**30),
              "faster_precision": "lean-factored", "faster_remat": "dots", "faster_speedup": speedup,
              "faster_compiled_bytes_per_chip": int(12.5 * 2**30)}
    line = fit.verdict(report)
    assert ("faster here" in line) is named and "\n" not in line
    if named:
        assert line.endswith("; faster here: precision lean-factored, remat dots: ~1.40x by the compiler's figures (12.50 GiB "
                             "per chip; set gemma-tpu:training precision: lean-factored, docs/fit.md has its quality figures)")
    assert "faster" not in fit.verdict({key: value for key, value in report.items() if not key.startswith("faster")})


def test_fit_reads_nothing_of_the_weights(monkeypatch, tmp_path):
    """gemma-tpu:training.weights on gs:// (a Hugging Face directory or a checkpoint): fit compiles from --model's
    shapes, on a machine without Google Cloud credentials too, and asks the bucket nothing."""
    compiles = _Compiles()
    monkeypatch.setattr(compiled, "fit", compiles)
    config = edited_config("dev", training={"weights": "gs://team-data/gemma-3-1b-it"})
    with gcs_stand_in.unreachable(gcs_stand_in.NO_CREDENTIALS, tmp_path) as requests:
        fits = fit.fit_runs(config, image=IMAGE)
    assert requests == []
    assert [f.run for f in fits] == [run.name for run in config.runs]
    assert compiles.calls[0][0].weights == "gs://team-data/gemma-3-1b-it"


def _fitting_report(**keys) -> dict:
    return {"run": "r", "accelerator": "v6e", "topology": "2x4", "slices": 1, "fits": True, "compiled_bytes_per_chip": 30 * 2**30,
            "usable_hbm_bytes_per_chip": int(31.24 * 2**30), "headroom_gib": 1.24, "flops_per_chip_per_step": 1e14,
            "bytes_accessed_per_chip": 1e11, "step_time_bound_s": 0.1, "bound_by": "flops", "mfu_bound": 0.5, **keys}


def test_the_table_names_the_largest_batchs_remat_policy():
    """The largest batch holds for one rematerialisation policy (trainer.measure.compiled.search_config): the
    table says which; a search skipped (--no-batch-search) is a dash, not a batch of 0."""
    lines = fit.table([_fitting_report(largest_batch=16, largest_batch_remat="none"),
                       _fitting_report(run="s", largest_batch=None, largest_batch_remat=None)]).splitlines()
    column = lines[0].index("largest batch")
    assert lines[1][column:].startswith("16 (remat none)")
    assert lines[2][column:].startswith("- ")


def test_a_run_with_a_local_tier_reports_its_host_memory_beside_the_chips_figures(monkeypatch):
    """gemma-tpu:training.localCheckpointInterval: fit's report and table give the tier's bytes on each host
    (3 steps of the host's share: gemma3-270m float32 on the 2 hosts of a 2x4, 12 bytes x 268.1M / 2); a run
    without it has a dash there and no such key."""
    from trainer.gemma3.config import MODELS
    from trainer.measure.flops import param_count

    monkeypatch.setattr(compiled, "fit", _Compiles())
    (with_tier,) = fit.fit_runs(edited_config("multihost", training={"localCheckpointInterval": 50}), image=IMAGE)
    (without,) = fit.fit_runs(edited_config("multihost", training={"localCheckpointInterval": None}), image=IMAGE)
    model = stack_config("multihost").runs[0].training.model
    assert with_tier.report["local_tier_bytes_per_host"] == 3 * 12 * param_count(MODELS[model]) // 2
    assert "local_tier_bytes_per_host" not in without.report
    lines = fit.table([_fitting_report(**with_tier.report), _fitting_report(run="plain")]).splitlines()
    column = lines[0].index("local tier GiB/host")
    assert lines[1][column:] == f"{with_tier.report['local_tier_bytes_per_host'] / 2**30:.1f}" and lines[2][column:] == "-"


def test_accumulation_reaches_the_compile_and_is_said_where_a_batch_is(monkeypatch):
    """gemma-tpu:training.gradAccumSteps: the step compiled with it, the batch said as its micro-batches, the table's
    largest batch as micro-batches too, and a run that fits only so is told the gradAccumSteps that does."""
    compiles = _Compiles()
    monkeypatch.setattr(compiled, "fit", compiles)
    fit.fit_runs(edited_config("multihost", training={"batchSize": 64, "gradAccumSteps": 4}), image=IMAGE)
    (config, _, _), = compiles.calls
    assert (config.batch_size, config.grad_accum_steps, fit.batch_words(config)) == (64, 4, "64 as 4 micro-batches of 16")
    lines = fit.table([_fitting_report(largest_batch=96, largest_batch_remat="full", grad_accum_steps=4)]).splitlines()
    assert lines[1][lines[0].index("largest batch"):].startswith("96 = 4 x 24 (remat full)")
    report = {"run": "sweep", "accelerator": "v6e", "topology": "2x4", "slices": 1, "lora_rank": 0, "fits": False,
              "compiled_bytes_per_chip": 40 * 2**30, "usable_hbm_bytes_per_chip": int(31.24 * 2**30), "largest_batch": 48,
              "largest_batch_remat": "full", "batch_size": 128, "grad_accum_steps_that_fit": 4,
              "grad_accum_compiled_bytes_per_chip": 20 * 2**30}
    assert ("set gemma-tpu:training gradAccumSteps 4 (the same batch as 4 micro-batches of 32 rows, one after another: "
            "20.0 GiB per chip, which fits), or batchSize 48 or less") in fit.advice(report)
