"""Ours against the tutorial's method on one NVIDIA H200: `python -m bench.h200` (under 10 minutes).

The real Gemma 3 270M architecture (random initial weights; its 262,144-entry vocabulary, so the
logits cost what they cost), the benchmark corpus and its 512-piece tokenizer (no download: its
document lengths in tokens are TinyStories' in Gemma tokens), at sequence 256 and 1024. Each side
runs at the largest power-of-two batch whose compiled step fits the GPU's memory, found from XLA's
memory analysis of one small probe compile. Prints per side useful tokens/s, MFU, step time and
step memory, and the ratio ours/baseline of useful tokens/s.

`--dry-run` does the same on the CPU with the tiny model and a small batch, to check the script.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time

import jax

from bench import inputs as inputs_lib
from bench import throughput
from bench.baseline import Baseline
from bench.ours import Ours
from bench.side import Side
from bench.stats import mib
from trainer.measure import flops
from trainer import models

SEQ_LENS = (256, 1024)
TARGET_MFU = 0.4  # the project's target for ours at sequence 1024: 40% MFU
PROBE_BATCH = 8
MAX_BATCH = 1024  # also below the benchmark corpus's 4000 documents, which our loader's streams need
# Share of the GPU's memory a step may plan for: both sides' states stay resident, XLA's own workspace needs room.
MEMORY_SHARE = 0.8


@dataclasses.dataclass(frozen=True)
class Plan:
    schedule: throughput.Schedule
    max_batch: int
    budget: int | None  # bytes a compiled step may take; None: unknown, the batch is not searched


def gpu_plan() -> Plan:
    stats = jax.devices()[0].memory_stats() or {}
    budget = int(stats["bytes_limit"] * MEMORY_SHARE) if "bytes_limit" in stats else None
    return Plan(schedule=throughput.Schedule(warmup_steps=3, repeats=4, steps_per_repeat=5), max_batch=MAX_BATCH, budget=budget)


# The dry run searches the batch too, under a small budget and cap, so that every code path runs on the CPU.
DRY_RUN_PLAN = Plan(schedule=throughput.Schedule(warmup_steps=0, repeats=2, steps_per_repeat=1), max_batch=8, budget=512 * 2**20)


def make_side(name: str, model_config, inputs: inputs_lib.BenchInputs, *, seq_len: int, batch_size: int) -> Side:
    if name == "ours":
        return Ours(model_config, inputs.data, seq_len=seq_len, batch_size=batch_size)
    return Baseline(model_config, models.init_params(model_config, seed=0), inputs.tokenizer, inputs.documents(),
                    seq_len=seq_len, batch_size=batch_size)


def largest_batch(name: str, model_config, inputs, *, seq_len: int, budget: int, cap: int = MAX_BATCH) -> int:
    """The largest power of two whose step fits `budget`, extrapolated linearly in the batch from one probe compile
    (the batch-independent part is the step's arguments: weights, optimizer state)."""
    probe = make_side(name, model_config, inputs, seq_len=seq_len, batch_size=PROBE_BATCH)
    probe.compile()
    fixed = probe.memory_analysis().argument_size_in_bytes
    per_row = max(1, (probe.step_memory_bytes() - fixed) / PROBE_BATCH)
    probe.close()
    rows = (budget - fixed) / per_row
    return max(1, min(cap, 2 ** int(math.floor(math.log2(max(rows, 1))))))


def fitted_side(name: str, model_config, inputs, *, seq_len: int, batch_size: int, budget: int | None) -> Side:
    """One side compiled at `batch_size`, or at half of it as often as its compiled step exceeds `budget`."""
    while True:
        side = make_side(name, model_config, inputs, seq_len=seq_len, batch_size=batch_size)
        side.compile()
        if budget is None or side.step_memory_bytes() <= budget or batch_size == 1:
            print(f"  {name}: batch {batch_size}, compiled in {side.compile_s:.0f} s", flush=True)
            return side
        side.close()
        batch_size //= 2


def run(model_config, inputs, *, seq_len: int, plan: Plan, batch_size: int | None) -> None:
    """Both sides at `batch_size`, or each at its own largest batch; then alternating repeats as on the CPU."""
    budget = plan.budget
    print(f"[h200] seq_len {seq_len}: {flops.param_count(model_config):,} parameters, vocabulary {model_config.num_embed}, "
          f"{jax.devices()[0].device_kind}, step memory budget {'n/a' if budget is None else f'{budget / 2**30:.1f} GiB'}",
          flush=True)
    if batch_size is None and budget is None:
        raise SystemExit("error: the device reports no memory limit to search the batch under; pass --batch-size")
    sides = []
    for name in ("ours", "baseline"):
        batch = batch_size or largest_batch(name, model_config, inputs, seq_len=seq_len, budget=budget, cap=plan.max_batch)
        sides.append(fitted_side(name, model_config, inputs, seq_len=seq_len, batch_size=batch, budget=budget))
    results = throughput.measure(sides, plan.schedule, log=lambda line: None)
    throughput.report(sides, results, flops_per_token=flops.training_flops_per_token(model_config, seq_len))
    peak = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
    print(f"  device peak memory so far (both sides): {mib(peak)}")
    for side in sides:
        side.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.h200", description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, with the tiny model and a small batch")
    parser.add_argument("--batch-size", type=int, help="one global batch for both sides instead of the largest that fits")
    parser.add_argument("--workdir", default=inputs_lib.DEFAULT_WORKDIR, help="where the generated inputs are cached")
    args = parser.parse_args(argv)
    if args.batch_size is not None and args.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, got {args.batch_size}")
    start = time.perf_counter()
    if not args.dry_run and jax.default_backend() != "gpu":
        print(f"error: no GPU (JAX backend {jax.default_backend()!r}); install jax with its CUDA plugin, or pass --dry-run",
              file=sys.stderr)
        return 2
    inputs = inputs_lib.build_inputs(args.workdir)
    model_config = models.model_config("tiny" if args.dry_run else "gemma3-270m", vocab_size=inputs.tokenizer.vocab_size)
    plan = DRY_RUN_PLAN if args.dry_run else gpu_plan()
    print(f"  {inputs_lib.length_distribution(inputs, max(SEQ_LENS))}")
    for seq_len in SEQ_LENS:
        run(model_config, inputs, seq_len=seq_len, plan=plan, batch_size=args.batch_size)
    print(f"done in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
