"""`python -m workloads fit --stack NAME [--run RUN] [--json]`: does each run fit its TPU slice, and
what does its step cost? Answered by the TPU compiler, offline, before `pulumi up`. A run with a local
checkpoint tier (gemma-tpu:training.localCheckpointInterval) also gets the host memory the tier takes.

Each run's trainer command line is the one its Job or JobSet carries (workloads.spec), parsed by the
trainer's own parser; the slice (generation, topology, slices) comes from the catalog. The step that
trainer.measure.compiled compiles is the one the trainer runs: the run records the same fingerprint
in its config.json (`step_fingerprint`).
"""

from __future__ import annotations

import dataclasses
import json

from infra.config import RunConfig, StackConfig
from infra.config.runs import local_tier_bytes_per_host
from workloads.spec import RunSpec, run_spec

_GIB = 2**30


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunFit:
    run: str
    spec: RunSpec
    report: dict


def select_runs(config: StackConfig, run_name: str | None) -> tuple[RunConfig, ...]:
    if run_name is None:
        return config.runs
    runs = tuple(run for run in config.runs if run.name == run_name)
    if not runs:
        names = ", ".join(run.name for run in config.runs)
        raise ValueError(f"--run {run_name}: the stack has no such run (its runs: {names})")
    return runs


def fit_runs(config: StackConfig, *, image: str, run_name: str | None = None, search_batch: bool = True,
             compare_splits: bool = False) -> list[RunFit]:
    """Compile every selected run's step for its slice (several minutes a run for the real models)."""
    from trainer.config import parse_config
    from trainer.run import compile_answers
    from trainer.measure import compiled

    fits = []
    for run in select_runs(config, run_name):
        spec = run_spec(config, run, image=image)
        # The step is compiled from --model's shapes: the weights, data and tokenizer are not read (docs/fit.md).
        train_config = parse_config(list(spec.trainer_args))
        devices = compiled.tpu_devices(config.tpu.accelerator, config.tpu.topology, num_slices=run.slices)
        compile_answers.say(f"run {run.name}: {train_config.model}, batch {batch_words(train_config)} x {train_config.seq_len}, "
                            f"{config.tpu.accelerator} {config.tpu.topology} x {run.slices}")
        with compile_answers.doing(f"run {run.name}"):
            report = compiled.fit(train_config, devices, num_slices=run.slices, search_batch=search_batch,
                                  compare_splits=compare_splits).report()
        compile_answers.say(f"run {run.name}: done")
        report = {"run": run.name, "accelerator": config.tpu.accelerator, "topology": config.tpu.topology,
                  "slices": run.slices, **report}
        if run.training.local_checkpoint_interval is not None:  # host memory, beside the chips' figures
            report["local_tier_bytes_per_host"] = local_tier_bytes_per_host(run.training, config.slice)
        fits.append(RunFit(run=run.name, spec=spec, report=report))
    return fits


def batch_words(train_config) -> str:
    """The run's batch, as its step runs it: `128`, or `128 as 4 micro-batches of 32` (--grad-accum-steps)."""
    steps = train_config.grad_accum_steps
    batch = train_config.batch_size
    return str(batch) if steps == 1 else f"{batch} as {steps} micro-batches of {batch // steps}"


# What a refused run may change, as a stack names it (gemma-tpu:training's keys).
STACK_KEYS = {"precision": "precision", "grad_accum_steps": "gradAccumSteps", "batch_size": "batchSize"}


def advice(report: dict) -> str:
    """One line for a run that does not fit: by how much, and what to change."""
    needed, usable = report["compiled_bytes_per_chip"] / _GIB, report["usable_hbm_bytes_per_chip"] / _GIB
    from trainer.measure import compiled

    changes = compiled.fitting_settings(report, STACK_KEYS)
    if not report["lora_rank"]:
        changes.append("loraRank 8 (LoRA trains ~1% of the weights)")
    changes.append("a larger topology or more slices")
    return (f"run {report['run']}: does not fit {report['accelerator']} {report['topology']} x {report['slices']}: the step needs "
            f"{needed:.1f} GiB per chip, the compiler allows {usable:.2f} GiB ({needed - usable:.1f} GiB over); "
            f"set gemma-tpu:training {', or '.join(changes)}")


# A faster setting is named when the compiler's figures put it at least this much ahead (their bound is not the step's time).
NAMED_SPEEDUP = 1.1


def verdict(report: dict) -> str:
    """One line for a run that fits: its bytes per chip against the limit, what they cover, and a faster
    precision that fits where the compiler's figures say so."""
    needed, usable = report["compiled_bytes_per_chip"] / _GIB, report["usable_hbm_bytes_per_chip"] / _GIB
    faster = ""
    if report.get("faster_speedup", 0) >= NAMED_SPEEDUP:
        faster = (f"; faster here: precision {report['faster_precision']}, remat {report['faster_remat']}: "
                  f"~{report['faster_speedup']:.2f}x by the compiler's figures ({report['faster_compiled_bytes_per_chip'] / _GIB:.2f} "
                  f"GiB per chip; set gemma-tpu:training precision: {report['faster_precision']}, docs/fit.md has its quality figures)")
    return (f"run {report['run']}: fits {report['accelerator']} {report['topology']} x {report['slices']}: {needed:.2f} of "
            f"{usable:.2f} GiB per chip ({usable - needed:.2f} free); that is all the run keeps on a chip: the training "
            "state, frozen weights and batch, the step's outputs, temporaries and code (samples and evaluation run "
            "between steps, in what the step frees); the trainer checks the same against the device before its first step"
            + faster)


_COLUMNS = (("run", "run", "{}"), ("slice", None, None), ("compiled GiB/chip", "compiled_bytes_per_chip", "{:.2f}"),
            ("usable GiB", "usable_hbm_bytes_per_chip", "{:.2f}"), ("headroom GiB", "headroom_gib", "{:.2f}"),
            ("largest batch", None, None), ("TFLOP/chip/step", "flops_per_chip_per_step", "{:.2f}"),
            ("GB accessed/chip", "bytes_accessed_per_chip", "{:.1f}"), ("bound ms", "step_time_bound_s", "{:.1f}"),
            ("bound by", "bound_by", "{}"), ("MFU bound", "mfu_bound", "{:.0%}"),
            ("local tier GiB/host", "local_tier_bytes_per_host", "{:.1f}"))
_SCALE = {"compiled_bytes_per_chip": _GIB, "usable_hbm_bytes_per_chip": _GIB, "flops_per_chip_per_step": 1e12,
          "bytes_accessed_per_chip": 1e9, "step_time_bound_s": 1e-3, "local_tier_bytes_per_host": _GIB}


def _composed_cell(title: str, report: dict) -> str:
    if title == "slice":
        return f"{report['accelerator']} {report['topology']} x{report['slices']}"
    if report.get("largest_batch") is None:  # --no-batch-search
        return "-"
    steps = report.get("grad_accum_steps", 1)
    batch = report["largest_batch"] if steps == 1 else f"{report['largest_batch']} = {steps} x {report['largest_batch'] // steps}"
    return f"{batch} (remat {report['largest_batch_remat']})"


def table(reports: list[dict]) -> str:
    rows = [[title for title, _, _ in _COLUMNS]]
    for report in reports:
        row = []
        for title, key, form in _COLUMNS:
            if key is None:
                row.append(_composed_cell(title, report))
            elif key not in report:
                row.append("-")
            else:
                value = report[key]
                row.append(form.format(value / _SCALE[key] if key in _SCALE else value))
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def splits_table(reports: list[dict]) -> str:
    """Each run's FSDP groups side by side (`--splits`), and the stack key that picks the fastest."""
    lines = []
    for report in reports:
        lines.append(f"\nrun {report['run']}: FSDP groups of a {report['topology']} slice")
        for row in report["splits"]:
            figures = (f"{row['step_time_bound_s'] * 1e3:.1f} ms bound by {row['bound_by']}, MFU bound {row['mfu_bound']:.0%}, "
                       f"{row['ici_bytes_per_chip'] / 1e9:.1f} GB over ICI" if row["fits"] else "does not fit")
            lines.append(f"  fsdp={row['mesh']['fsdp']}: {row['compiled_bytes_per_chip'] / _GIB:.2f} GiB/chip, {figures}")
        best = report["best_mesh"]
        lines.append(f"  fastest that fits: set gemma-tpu:training fsdp: {best['fsdp']}" if best else "  none fits")
    return "\n".join(lines)


def to_json(reports: list[dict]) -> str:
    return json.dumps(reports, indent=2)
