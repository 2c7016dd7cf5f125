"""Whole runs of the real trainer on the tiny model: the loss falls, outputs land in the workdir, LoRA
trains only adapters."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from gemma import gm

from infra.observability import telemetry
from infra.config import parse_stack_config
from infra.config.stack_files import offline_values
from tests.infra.observability import monitoring_filters
from tests.trainer.measure.test_goodput import assert_accounts_for_the_wall_time
from trainer.data import loader as data
from trainer import contract, loop
from trainer.model import models
from trainer.config import parse_config
from trainer.data.corpus import write_corpus
from trainer.run.metrics import read_metrics

# Small rows and batches: a step takes well under a second on one CPU core.
FAST = ["--seq-len", "64", "--batch-size", "8", "--eval-fraction", "0.05", "--no-samples"]


def tiny_args(workdir, prepared_dir, tokenizer_path, *extra):
    return ["--model", "tiny", "--weights", "random", "--data", str(prepared_dir), "--tokenizer", str(tokenizer_path),
            "--workdir", str(workdir), *FAST, *extra]


FULL_RUN = ("--steps", "30", "--lr", "3e-3", "--warmup-steps", "5", "--log-interval", "5", "--eval-interval", "15",
            "--checkpoint-interval", "15", "--keep-checkpoints", "1")


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, prepared_dir, tokenizer_path):
    workdir = tmp_path_factory.mktemp("full_run")
    loop.train(parse_config(tiny_args(workdir, prepared_dir, tokenizer_path, *FULL_RUN)))
    return workdir


def test_fit_compiles_the_step_the_run_ran(full_run, prepared_dir, tokenizer_path):
    """`python -m workloads fit` compiles the step through trainer.measure.compiled from the run's options
    alone (its --steps included: the learning-rate schedule is part of the program); the run records the
    digest of the program it trained with. Equal digests: the same program, arguments, shapes and
    shardings. Another batch or another step count is another program; with --epochs the step count
    comes from the data, which fit does not read, so it reports no digest."""
    from trainer.measure import compiled

    recorded = json.loads((full_run / "config.json").read_text())
    config = parse_config(tiny_args(full_run, prepared_dir, tokenizer_path, *FULL_RUN))
    model_config = models.model_config("tiny", vocab_size=512)
    fit = lambda config: compiled.compile_train_step(config, model_config, jax.devices())  # noqa: E731
    step_compiled = fit(config)
    assert (step_compiled.fingerprint, step_compiled.total_steps) == (recorded["step_fingerprint"], recorded["total_steps"])
    assert fit(dataclasses.replace(config, batch_size=16)).fingerprint != recorded["step_fingerprint"]
    assert fit(dataclasses.replace(config, steps=1000)).fingerprint != recorded["step_fingerprint"]
    assert fit(dataclasses.replace(config, steps=None)).fingerprint is None


def test_loss_falls_on_the_tiny_setup(full_run):
    records = [r for r in read_metrics(full_run / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in records] == [1, 5, 10, 15, 20, 25, 30]  # the first step, then every 5
    assert records[0]["loss"] == pytest.approx(np.log(512), abs=0.3)  # random init: about uniform over the vocabulary
    assert records[-1]["loss"] < records[0]["loss"] - 1.5
    evals = [r["eval_loss"] for r in read_metrics(full_run / "metrics.jsonl") if "eval_loss" in r]
    assert len(evals) == 2 and evals[1] < evals[0]


def test_reports_carry_throughput_and_mfu_is_unknown_on_cpu(full_run):
    last = read_metrics(full_run / "metrics.jsonl")[-1]
    assert last["tokens_per_sec"] > 0 and last["step_time_s"] > 0
    assert last["tokens_per_sec_per_device"] == pytest.approx(last["tokens_per_sec"] / jax.device_count())
    assert last["mfu"] is None
    assert last["eval_perplexity"] == pytest.approx(np.exp(last["eval_loss"]), rel=1e-6)


def test_json_log_lines_hold_what_the_stacks_log_metrics_extract(tmp_path, prepared_dir, tokenizer_path, capsys):
    """The training pods run --log-format json. Each of the stack's log-based metrics on the trainer's
    lines matches real report lines, as GKE logs them from a run's pod, and extracts a number there;
    a report without the number (step 1 has no throughput yet) is not counted."""
    loop.train(parse_config(tiny_args(tmp_path, prepared_dir, tokenizer_path, "--steps", "2", "--log-format", "json")))
    values, stack = offline_values("multihost")
    config = parse_stack_config(values, stack)
    labels = {"cluster_name": config.cluster_name, "namespace_name": config.namespace, "container_name": "trainer",
              "pod_name": "gemma-finetune-0123abcd-slice-0-1-x7k2p"}  # fmt: skip
    entries = [{"resource": {"type": "k8s_container", "labels": labels}, "jsonPayload": json.loads(line)}
               for line in capsys.readouterr().out.splitlines()]  # fmt: skip
    events = [(entry["jsonPayload"]["event"], entry["jsonPayload"].get("tag"), entry["jsonPayload"]["step"]) for entry in entries]
    assert events == [("text", "data", 1), ("report", None, 1), ("report", None, 2)]
    run = telemetry.run_telemetry(config)
    for metric, steps in ((run.loss, [1, 2]), (run.tokens_per_sec, [2]), (run.step_time, [2])):
        counted = [entry for entry in entries if monitoring_filters.matches(metric.filter, entry)]
        assert [entry["jsonPayload"]["step"] for entry in counted] == steps, metric.key
        for entry in counted:
            assert monitoring_filters.extract(metric.value_extractor, entry) > 0
            assert monitoring_filters.extract(metric.labels["run"], entry) == "gemma-finetune-0123abcd"
    # The goodput and each badput share, on every report: shares of the wall time, summing to one.
    for entry in [entry for entry in entries if entry["jsonPayload"]["event"] == "report"]:
        shares = [monitoring_filters.extract(metric.value_extractor, entry) for metric in (run.goodput, *run.badput.values())
                  if monitoring_filters.matches(metric.filter, entry)]
        assert len(shares) == 1 + len(run.badput) and shares[0] > 0 and sum(shares) == pytest.approx(1.0)


def test_run_leaves_config_checkpoint_events_plot_and_loadable_export(full_run, tokenized_data):
    resolved = json.loads((full_run / "config.json").read_text())
    assert resolved["total_steps"] == 30 and resolved["model_config"]["num_embed"] == tokenized_data.vocab_size
    assert resolved["checkpoint_dir"] == str(full_run / "checkpoints")
    assert sorted(p.name for p in (full_run / "checkpoints").iterdir() if p.name.isdigit()) == ["30"]  # keep 1
    assert list((full_run / "tensorboard").glob("events.out.tfevents.*"))
    assert (full_run / "loss.png").stat().st_size > 0
    params = gm.ckpts.load_params(full_run / "export" / "params")
    expected = jax.eval_shape(lambda: models.init_params(models.model_config("tiny", vocab_size=tokenized_data.vocab_size), seed=0))
    assert jax.tree.map(lambda x: x.shape, params) == jax.tree.map(lambda x: x.shape, expected)


def test_the_demo_runs_goodput_accounts_for_its_whole_wall_time(full_run):
    breakdown = assert_accounts_for_the_wall_time(full_run, attempts=1)  # prints the table (pytest -s)
    assert breakdown.seconds["UNPRODUCTIVE_CHECKPOINT_SAVE_TIME"] > 0 and breakdown.seconds["OTHER"] > 0  # saves; evals, export
    assert breakdown.seconds["WASTED_PROGRESS_FROM_DISRUPTION"] == breakdown.seconds["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] == 0
    # The last report's goodput is the run's up to its last step (before the final save, samples, export).
    last = read_metrics(full_run / "metrics.jsonl")[-1]
    assert breakdown.goodput < last["goodput"] < 1


def test_lora_trains_only_the_adapters(tmp_path, prepared_dir, tokenizer_path, tokenized_data):
    args = tiny_args(tmp_path, prepared_dir, tokenizer_path, "--steps", "4", "--lora-rank", "4", "--lr", "1e-2",
                     "--eval-fraction", "0", "--seed", "3")
    loop.train(parse_config(args))
    config = models.model_config("tiny", vocab_size=tokenized_data.vocab_size)
    # --weights random: the frozen base, held in the run's compute dtype (so exported rounded to it).
    compute_dtype = json.loads((tmp_path / "config.json").read_text())["compute_dtype"]
    base = jax.tree.map(lambda p: p.astype(compute_dtype).astype(np.float32), models.init_params(config, seed=3))
    adapters = gm.ckpts.load_params(tmp_path / "export" / "lora")
    assert {k for path in jax.tree_util.tree_flatten_with_path(adapters)[0] for k in [str(path[0][-2])]} == {"['lora']"}
    initial = models.init_adapters(config, seed=4, lora_rank=4)
    assert all(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(adapters), jax.tree.leaves(initial)) if np.any(b))
    merged = gm.ckpts.load_params(tmp_path / "export" / "params")
    flat_base = dict(jax.tree_util.tree_flatten_with_path(base)[0])
    changed = {jax.tree_util.keystr(path) for path, value in jax.tree_util.tree_flatten_with_path(merged)[0]
               if not np.array_equal(np.asarray(value), np.asarray(flat_base[path]))}
    # Exactly the adapted matrices moved: embeddings and norms are frozen.
    assert changed and all(name.endswith(("['w']", "['gating_einsum']", "['linear']")) for name in changed)
    assert not any("embedder" in name or "norm" in name for name in changed)


def test_diverging_loss_stops_with_one_line_and_keeps_the_last_good_checkpoint(tmp_path, prepared_dir, tokenizer_path, capsys):
    from trainer.__main__ import main

    args = tiny_args(tmp_path, prepared_dir, tokenizer_path, "--steps", "6", "--lr", "1e9", "--warmup-steps", "0",
                     "--lr-schedule", "constant", "--eval-fraction", "0", "--log-interval", "1", "--checkpoint-interval", "1")
    assert main(args) == contract.USER_ERROR
    err = capsys.readouterr().err.strip()
    assert "training diverged" in err and "lower --lr" in err and "\n" not in err, err
    kept = [int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()]
    assert f"the last good checkpoint is step {max(kept)} in {tmp_path / 'checkpoints'}" in err
    diverged_step = int(err.split(" at step ")[1].split(";")[0])
    assert max(kept) == diverged_step - 1


def test_epochs_mode_trains_one_full_pass_of_a_raw_text_file(tmp_path, tokenizer_path, tokenizer):
    """The stack's default (steps unset, epochs 1) on a raw text file, prepared on the fly: as many
    steps as the loader's epoch has batches."""
    corpus = write_corpus(tmp_path / "small.txt", num_stories=60, seed=1)
    args = ["--model", "tiny", "--weights", "random", "--data", str(corpus), "--tokenizer", str(tokenizer_path),
            "--workdir", str(tmp_path / "run"), "--seq-len", "128", "--batch-size", "8", "--epochs", "1",
            "--eval-fraction", "0.1", "--no-samples"]
    loop.train(parse_config(args))
    opened = data.open_data(str(corpus), tokenizer=tokenizer, cache_dir=str(tmp_path / "run" / "data_cache"))
    expected = data.steps_per_epoch(opened, seq_len=128, global_batch_size=8, eval_fraction=0.1)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["total_steps"] == expected > 1
    assert read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]["step"] == expected
