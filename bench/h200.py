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
from trainer import flops, models

SEQ_LENS = (256, 1024)
PROBE_BATCH = 8
MAX_BATCH = 1024  # also below the benchmark corpus's 4000 documents, which our loader's streams need
# Share of the GPU's memory a step may plan for: both sides' states stay resident, XLA's own workspace needs room.
MEMORY_SHARE = 0.8
SCHEDULE = throughput.Schedule(warmup_steps=3, repeats=4, steps_per_repeat=5)
DRY_RUN_SCHEDULE = throughput.Schedule(warmup_steps=0, repeats=2, steps_per_repeat=1)
DRY_RUN_BATCH = 4


def _gemma3_270m(vocab_size: int):
    return models.model_config("gemma3-270m", vocab_size=vocab_size)


def _tiny(vocab_size: int):
    return models.tiny_config(vocab_size)


def make_side(name: str, model_config, inputs: inputs_lib.BenchInputs, *, seq_len: int, batch_size: int) -> Side:
    if name == "ours":
        return Ours(model_config, inputs.data, seq_len=seq_len, batch_size=batch_size)
    return Baseline(model_config, models.init_params(model_config, seed=0), inputs.tokenizer, inputs.documents(),
                    seq_len=seq_len, batch_size=batch_size)


def memory_budget() -> int | None:
    stats = jax.devices()[0].memory_stats()
    return int(stats["bytes_limit"] * MEMORY_SHARE) if stats and "bytes_limit" in stats else None


def largest_batch(name: str, model_config, inputs, *, seq_len: int, budget: int) -> int:
    """The largest power of two whose step fits `budget`, extrapolated linearly in the batch from one probe compile
    (the batch-independent part is the step's arguments: weights, optimizer state)."""
    probe = make_side(name, model_config, inputs, seq_len=seq_len, batch_size=PROBE_BATCH)
    probe.compile()
    fixed = probe.memory_analysis().argument_size_in_bytes
    per_row = max(1, (probe.step_memory_bytes() - fixed) / PROBE_BATCH)
    probe.close()
    rows = (budget - fixed) / per_row
    return max(1, min(MAX_BATCH, 2 ** int(math.floor(math.log2(max(rows, 1))))))


@dataclasses.dataclass
class Measured:
    side: Side
    batch_size: int
    results: throughput.Repeats


def measure_side(name: str, model_config, inputs, *, seq_len: int, batch_size: int, budget: int | None, schedule) -> Measured:
    """One side at `batch_size`; when its compiled step turns out larger than `budget`, at half the batch."""
    while True:
        side = make_side(name, model_config, inputs, seq_len=seq_len, batch_size=batch_size)
        side.compile()
        if budget is None or side.step_memory_bytes() <= budget or batch_size == 1:
            break
        side.close()
        batch_size //= 2
    results = throughput.measure([side], schedule, log=lambda line: None)[name]
    return Measured(side=side, batch_size=batch_size, results=results)


def run(model_config, inputs, *, seq_len: int, schedule, batch_size: int | None) -> None:
    budget = memory_budget()
    device = jax.devices()[0]
    print(f"[h200] seq_len {seq_len}: {flops.param_count(model_config):,} parameters, vocabulary {model_config.num_embed}, "
          f"{device.device_kind}, step memory budget {'n/a' if budget is None else f'{budget / 2**30:.0f} GiB'}", flush=True)
    measured = {}
    for name in ("ours", "baseline"):
        batch = batch_size or (largest_batch(name, model_config, inputs, seq_len=seq_len, budget=budget) if budget else DRY_RUN_BATCH)
        measured[name] = measure_side(name, model_config, inputs, seq_len=seq_len, batch_size=batch, budget=budget,
                                      schedule=schedule)
        print(f"  {name}: batch {measured[name].batch_size}", flush=True)
    sides = [m.side for m in measured.values()]
    throughput.report(sides, {name: m.results for name, m in measured.items()},
                      flops_per_token=flops.training_flops_per_token(model_config, seq_len))
    for side in sides:
        side.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.h200", description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, with the tiny model and a small batch")
    parser.add_argument("--batch-size", type=int, help="one global batch for both sides instead of the largest that fits")
    parser.add_argument("--workdir", default=inputs_lib.DEFAULT_WORKDIR, help="where the generated inputs are cached")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if not args.dry_run and jax.default_backend() != "gpu":
        print(f"error: no GPU (JAX backend {jax.default_backend()!r}); install jax with its CUDA plugin, or pass --dry-run",
              file=sys.stderr)
        return 2
    inputs = inputs_lib.build_inputs(args.workdir)
    model_config = (_tiny if args.dry_run else _gemma3_270m)(inputs.tokenizer.vocab_size)
    print(f"  {inputs_lib.length_distribution(inputs, max(SEQ_LENS))}")
    for seq_len in SEQ_LENS:
        run(model_config, inputs, seq_len=seq_len, schedule=DRY_RUN_SCHEDULE if args.dry_run else SCHEDULE,
            batch_size=args.batch_size or (DRY_RUN_BATCH if args.dry_run else None))
    print(f"done in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
