"""Ours against the tutorial's method, in one process: `python -m bench.throughput [--config tiny|mid] [--quick]`.

Each side compiles its step ahead of time (reported apart), runs warm-up steps, then the sides
alternate repeats of a few steps each, so that a change in the machine's load hits both alike.
A repeat dispatches its steps back to back (the host prepares the next batch while the device
computes, as in a training loop) and waits for the last one.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

import jax

from bench import inputs as inputs_lib
from bench.baseline import Baseline
from bench.ours import Ours
from bench.side import Side
from bench.stats import Repeats, mib, peak_rss_bytes, spread
from trainer.config import PRESET_VALUES, TINY, TrainConfig
from trainer.gemma3.config import Gemma3Config
from trainer.measure import flops
from trainer.model import models
from trainer.run import hardware
from trainer.run.mesh import jax_entry_point


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchConfig:
    name: str
    description: str
    seq_len: int
    batch_size: int
    layers: int | None = None  # None: the model's own; else its first `layers` blocks

    def model_config(self, vocab_size: int) -> Gemma3Config:
        if self.name == "tiny":
            return models.model_config(TINY, vocab_size=vocab_size)
        config = models.model_config("gemma3-270m", vocab_size=vocab_size)
        return dataclasses.replace(config, num_embed=vocab_size, num_layers=self.layers or config.num_layers)


_TINY = PRESET_VALUES["tiny"]
CONFIGS = {
    "tiny": BenchConfig(name="tiny", description="the `--preset tiny` model, sequence and batch",
                        seq_len=_TINY["seq_len"], batch_size=_TINY["batch_size"]),
    # Two Gemma 3 270M blocks: on 2 CPU cores 6 of them at batch 8 take 15-40 s a step, 18 minutes a run.
    # Both are sliding-window blocks, which at this sequence (below the 512 window) attend as global ones do.
    "mid": BenchConfig(name="mid", description="Gemma 3 270M block shapes, its first 2 blocks, the tokenizer's vocabulary",
                       seq_len=TrainConfig().seq_len, batch_size=4, layers=2),
}


@dataclasses.dataclass(frozen=True)
class Schedule:
    warmup_steps: int
    repeats: int
    steps_per_repeat: int


FULL = Schedule(warmup_steps=2, repeats=5, steps_per_repeat=4)
QUICK = Schedule(warmup_steps=1, repeats=3, steps_per_repeat=2)


def build_sides(config: BenchConfig, inputs: inputs_lib.BenchInputs, *, seq_len: int, batch_size: int, seed: int = 0,
                what_if_dtypes: tuple[str, ...] = ()) -> list[Side]:
    """Both sides on the same inputs and the same initial weights; `what_if_dtypes` add ours with another compute dtype."""
    model_config = config.model_config(inputs.tokenizer.vocab_size)
    baseline = Baseline(model_config, models.init_params(model_config, seed=seed), inputs.tokenizer, inputs.documents(),
                        seq_len=seq_len, batch_size=batch_size)
    ours = [Ours(model_config, inputs.data, seq_len=seq_len, batch_size=batch_size, seed=seed, dtype=dtype)
            for dtype in (None, *what_if_dtypes)]
    return [*ours, baseline]


def time_repeat(side: Side, steps: int) -> tuple[float, int, int]:
    start = time.perf_counter()
    counts = [side.step() for _ in range(steps)]
    side.wait()
    return time.perf_counter() - start, sum(c.useful_tokens for c in counts), sum(c.positions for c in counts)


def measure(sides: list[Side], schedule: Schedule, log=print) -> dict[str, Repeats]:
    for side in sides:
        side.compile()
        log(f"  {side.name}: compiled in {side.compile_s:.1f} s")
        for _ in range(schedule.warmup_steps):
            side.step()
        side.wait()
    results = {side.name: Repeats() for side in sides}
    for repeat in range(schedule.repeats):
        for side in sides if repeat % 2 == 0 else sides[::-1]:
            results[side.name].add(*time_repeat(side, schedule.steps_per_repeat), schedule.steps_per_repeat)
    return results


def mfu_figures(repeats: Repeats, flops_per_token: float, peak: float | None) -> dict:
    """The benchmark's MFU, as bench.throughput and bench.device_side both report it: `mfu` of the useful
    tokens (what a user's data gets; padding computed is not counted), `mfu_all_positions` of every
    position computed, padding included (the trainer's own `mfu` counts so)."""
    devices = jax.device_count()
    return {"mfu": flops.model_flops_utilization(repeats.useful_tokens_per_sec / devices, flops_per_token, peak),
            "mfu_all_positions": flops.model_flops_utilization(repeats.positions_per_sec / devices, flops_per_token, peak)}


def report(sides: list[Side], results: dict[str, Repeats], *, flops_per_token: float, out=sys.stdout) -> float:
    """Prints one line per side and the ratio; returns the ratio ours/baseline of useful tokens/s."""
    device = jax.devices()[0]
    peak = hardware.peak_bf16_flops(device.device_kind)
    for side in sides:
        r = results[side.name]
        mfu = mfu_figures(r, flops_per_token, peak)
        percent = lambda share: "n/a" if share is None else f"{share:.1%}"  # noqa: E731
        print(f"  {side.name:8s} batch {side.batch_size} | useful {r.useful_tokens_per_sec:10,.0f} tok/s | all {r.positions_per_sec:10,.0f} tok/s | "
              f"padding {r.padding_fraction:5.1%} | step {statistics.median(r.step_times) * 1e3:8.1f} ms median, "
              f"spread {spread(r.step_times):4.0%} over {len(r.step_times)} repeats | "
              f"MFU of useful tokens {percent(mfu['mfu'])} (all positions {percent(mfu['mfu_all_positions'])}) | step memory {mib(side.step_memory_bytes())} | "
              f"compile {side.compile_s:.1f} s | truncated away {side.truncated_fraction():.0%}", file=out)
    baseline = results["baseline"]
    for side in sides:
        if side.name == "baseline":
            continue
        r = results[side.name]
        # useful tok/s = all tok/s x (1 - padding): the ratio is the product of these two factors.
        packing = (1 - r.padding_fraction) / (1 - baseline.padding_fraction)
        per_position = r.positions_per_sec / baseline.positions_per_sec
        print(f"  ratio {side.name}/baseline, useful tokens/s: {r.useful_tokens_per_sec / baseline.useful_tokens_per_sec:.2f}x "
              f"= {packing:.2f}x from padding ({1 / (1 - baseline.padding_fraction):.2f}x would remove all of the baseline's) "
              f"x {per_position:.2f}x positions/s", file=out)
    return results["ours"].useful_tokens_per_sec / baseline.useful_tokens_per_sec


def run(config: BenchConfig, inputs: inputs_lib.BenchInputs, schedule: Schedule, *,
        what_if_dtypes: tuple[str, ...] = ()) -> dict[str, Repeats]:
    print(f"[throughput {config.name}] {config.description}: seq_len {config.seq_len}, global batch {config.batch_size}, "
          f"{jax.device_count()} x {jax.devices()[0].device_kind}, load average {os.getloadavg()[0]:.1f}")
    model_config = config.model_config(inputs.tokenizer.vocab_size)
    print(f"  model: {flops.param_count(model_config):,} parameters, {model_config.num_layers} layers, "
          f"vocabulary {model_config.num_embed}")
    print(f"  {inputs_lib.length_distribution(inputs, config.seq_len)}")
    sides = build_sides(config, inputs, seq_len=config.seq_len, batch_size=config.batch_size, what_if_dtypes=what_if_dtypes)
    results = measure(sides, schedule, log=lambda line: print(line, flush=True))
    report(sides, results, flops_per_token=flops.training_flops_per_token(model_config, config.seq_len))
    print(f"  process peak RSS so far (all sides, inputs, compilers): {mib(peak_rss_bytes())}")
    for side in sides:
        side.close()
    return results


@jax_entry_point("bench.throughput: ")
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), action="append", help="configuration(s) to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="fewer warm-up steps and repeats")
    parser.add_argument("--what-if-dtype", choices=("bfloat16", "float32"), action="append", default=[],
                        help="also run ours with this compute dtype instead of the trainer's choice for the platform")
    parser.add_argument("--workdir", default=inputs_lib.DEFAULT_WORKDIR, help="where the generated inputs are cached")
    args = parser.parse_args(argv)
    inputs = inputs_lib.build_inputs(args.workdir)
    for name in args.config or CONFIGS:
        run(CONFIGS[name], inputs, QUICK if args.quick else FULL, what_if_dtypes=tuple(args.what_if_dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
