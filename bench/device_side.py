"""One side of one accelerator-benchmark case, in a process of its own (bench.device starts it).

`python -m bench.device_side --side ours --model gemma3-270m --seq-len 1024 --batch 64 --result R.json`
holds the chip for this side alone (a TPU admits one program at a time), halves the batch while the
step does not fit the device's memory, times it (warm-up, then repeats of back-to-back steps) and
writes its figures to R.json: useful tokens/s, MFU, step time, compiled step memory against the
device's peak, and the compiler's roofline bound against the measured step.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import statistics
import sys
import tempfile
import time

import jax

from bench import inputs as inputs_lib
from bench import training_choice
from bench.baseline import Baseline
from bench.ours import Ours
from bench.side import Side
from bench.stats import spread
from bench.throughput import Schedule, measure, mfu_figures
from trainer import config as config_lib
from trainer.errors import UserError
from trainer.measure import flops, hbm_traffic, step_profile
from trainer.model import models
from trainer.run import compile_answers, hardware, hbm, mesh, step

LORA_RANK = 16  # ours when no full fine-tune fits the chip
# What ours trains, by --training: (precision, LoRA rank). auto takes the fastest full fine-tune the compiler fits
# (bench.training_choice), LoRA where none does: it trains something else.
TRAININGS = {"full": ("float32", 0), "lean": ("lean", 0), "lean-factored": ("lean-factored", 0), "lora": ("float32", LORA_RANK)}
FULL_FINE_TUNES, LORA = ("full", "lean", "lean-factored"), "lora"
# The first batch's estimate (rounded up to a power of two; halving corrects an overshoot): bytes of state per
# parameter (ours: weights, gradients and AdamW's moments; the baseline: bfloat16 weights and float32 moments),
# and per position the layers' saved activations (bfloat16, about 12 x the width and 4 x the feed-forward's
# per layer) plus, for the baseline, its full logits (bfloat16, and float32 in the loss).
STATE_BYTES_PER_PARAM = {"ours/full": 16, "ours/lean": 8, "ours/lean-factored": 6, "ours/lora": 2, "baseline": 8}
BASELINE_LOGIT_BYTES = 2 + 4 + 2
USABLE_SHARE = 0.9  # of the device's memory
PROFILE_STEPS = 3  # traced back to back after the timed repeats (--profile)


def training_label(training: str) -> str:
    precision, rank = TRAININGS[training]
    return f"LoRA rank {rank}" if rank else "full" if precision == "float32" else f"full, {precision} (bfloat16 state)"


def first_batch(side: str, model_config, *, seq_len: int, training: str, bytes_limit: int | None, cap: int) -> int:
    """The batch to try first: `cap` where the device reports no memory, else the estimate of what fits."""
    if bytes_limit is None:
        return cap
    key = f"ours/{training}" if side == "ours" else side
    state = flops.param_count(model_config) * STATE_BYTES_PER_PARAM[key]
    per_position = model_config.num_layers * (12 * model_config.embed_dim + 4 * model_config.hidden_dim) * 2
    if side == "baseline":
        per_position += model_config.num_embed * BASELINE_LOGIT_BYTES
    rows = max(1.0, (USABLE_SHARE * bytes_limit - state) / (per_position * seq_len))
    return min(cap, 1 << math.ceil(math.log2(rows)))


def make_side(name: str, model_config, inputs: inputs_lib.BenchInputs, *, seq_len: int, batch: int, training: str,
              step_options: dict | None = None) -> Side:
    """`step_options`: ours' TrainConfig fields beside the training's (remat, vocab_chunk)."""
    if name == "ours":
        precision, lora_rank = TRAININGS[training]
        return Ours(model_config, inputs.data, seq_len=seq_len, batch_size=batch, lora_rank=lora_rank, state_precision=precision,
                    **(step_options or {}))
    return Baseline(model_config, models.init_params(model_config, seed=0), inputs.tokenizer, inputs.documents(),
                    seq_len=seq_len, batch_size=batch)


def out_of_memory(error: Exception) -> bool:
    """The trainer's refusal (trainer.run.hbm), or the compiler's or the device's own (XLA's RESOURCE_EXHAUSTED)."""
    return isinstance(error, hbm.MemoryRefusal) or compile_answers.out_of_memory(error)


class DoesNotFit(Exception):
    """Even one row a step is refused for memory: the side cannot train this case on this device."""

    def __init__(self, refused: list[int], reason: str):
        super().__init__(f"batch 1 does not fit ({reason}); refused: {refused}")
        self.refused = refused


def halving(name: str, attempt, *, batch: int, log):
    """(attempt(batch), batches refused): `attempt` at `batch`, halved while the compiler or the device refuses it
    for memory; DoesNotFit when batch 1 is refused too. `attempt` closes the side it made before it raises."""
    refused = []
    while True:
        try:
            return attempt(batch), refused
        except Exception as error:  # the compiler's refusal, or the device's at run time
            if not out_of_memory(error):
                raise
            reason = str(error).splitlines()[0][:160]
            refused.append(batch)
            if batch == 1:
                raise DoesNotFit(refused, reason) from error
        gc.collect()  # the refused side's arrays leave the device
        log(f"  {name}: batch {batch} does not fit ({reason}); halving")
        batch //= 2


def _using(side: Side, use):
    """use(side), the side closed (its loader's thread stopped) when that raises."""
    try:
        return use(side)
    except Exception:
        side.close()
        raise


def fitted(name: str, model_config, inputs, *, seq_len: int, batch: int, training: str, schedule: Schedule, log,
           step_options: dict | None = None, compiled: Side | None = None):
    """(side, measured repeats, batches refused): the side at `batch`, halved while it does not fit;
    DoesNotFit when batch 1 does not either. `compiled`: the side already compiled at `batch`, measured first."""
    given = iter([compiled] if compiled else [])

    def attempt(rows: int):
        side = next(given, None) or make_side(name, model_config, inputs, seq_len=seq_len, batch=rows, training=training,
                                              step_options=step_options)
        return _using(side, lambda side: (side, measure([side], schedule, log=log)[side.name]))

    (side, repeats), refused = halving(name, attempt, batch=batch, log=log)
    return side, repeats, refused


def compiled_candidate(model_config, inputs, training: str, *, batch: int, seq_len: int, log, step_options: dict | None,
                       refusals: list[str]) -> training_choice.Candidate | None:
    """--training auto's candidate: ours with `training` compiled, not run, at `batch` halved while the compiler
    refuses it; None, its refusal added to `refusals`, where batch 1 is refused too. Its compile seconds count the
    batches refused before it (what the next candidate may take too)."""
    started = time.perf_counter()

    def attempt(rows: int):
        side = make_side("ours", model_config, inputs, seq_len=seq_len, batch=rows, training=training, step_options=step_options)
        _using(side, Side.compile)
        return side

    try:
        side, refused = halving("ours", attempt, batch=batch, log=log)
    except DoesNotFit as refusal:
        _refused(training, refusal, refusals, log)
        return None
    return training_choice.Candidate(training, side, tokens_per_step=side.batch_size * seq_len, speed=side.speed(),
                                     compile_s=time.perf_counter() - started, batches_refused=tuple(refused))


def _refused(training: str, refusal: DoesNotFit, refusals: list[str], log) -> None:
    log(f"  ours, {training_label(training)}: {refusal}")
    refusals.append(f"{training_label(training)}: {refusal}")


def auto_training(model_config, inputs, *, first, seq_len: int, schedule: Schedule, log, step_options: dict | None,
                  least_recomputation: str, seconds_left, measured_steps: int):
    """--training auto: (training, side, repeats, batches refused, the trainings refused, the Choice). The fastest
    full fine-tune by the compiler's bound (bench.training_choice), each compiled from `first(training)` halved, then
    measured; LoRA where none fits; DoesNotFit naming each refusal when LoRA does not either."""
    refusals = []
    choice = training_choice.choose(
        FULL_FINE_TUNES, lambda training: compiled_candidate(model_config, inputs, training, batch=first(training), seq_len=seq_len,
                                                             log=log, step_options=step_options, refusals=refusals),
        least_recomputation=least_recomputation, seconds_left=seconds_left, measured_steps=measured_steps, log=log)
    if (chosen := choice.chosen) is not None:
        log(f"  {choice.words()}")
        side, repeats, refused = fitted("ours", model_config, inputs, seq_len=seq_len, batch=chosen.side.batch_size,
                                        training=chosen.training, schedule=schedule, log=log, step_options=step_options,
                                        compiled=chosen.side)
        return chosen.training, side, repeats, [*chosen.batches_refused, *refused], refusals, choice
    try:
        return (LORA, *fitted("ours", model_config, inputs, seq_len=seq_len, batch=first(LORA), training=LORA, schedule=schedule,
                              log=log, step_options=step_options), refusals, choice)
    except DoesNotFit as refusal:
        _refused(LORA, refusal, refusals, log)
        raise DoesNotFit([], "; ".join(refusals)) from None


def roofline(hlo: str, model_flops: float, chip: hardware.Chip | None) -> dict:
    """The compiler's bound on one step: the model's FLOPs at the chip's peak, or the step's HBM bytes at
    its bandwidth, whichever is longer. The bytes are read from the compiled step's optimized program
    (trainer.measure.hbm_traffic.total): XLA's cost analysis ("bytes accessed") also counts the operands XLA
    keeps in the chip's on-chip memory (S(1)), which put LoRA's bytes bound (182 ms) above its measured step
    (152 ms) on one v5e chip."""
    moved = hbm_traffic.total(hlo) if hlo else 0
    if chip is None or not moved:
        return {"bound_s": None, "bound_by": None}
    flops_s, bytes_s = model_flops / chip.peak_bf16_flops, moved / chip.hbm_bytes_per_s
    return {"bound_s": max(flops_s, bytes_s), "bound_by": "flops" if flops_s >= bytes_s else "bytes",
            "flops_bound_s": flops_s, "bytes_bound_s": bytes_s, "hbm_bytes_per_step": moved}


def run(args) -> dict:
    device = jax.devices()[0]
    if args.accelerator and device.platform == "cpu":
        raise UserError(f"no accelerator: JAX's first device is {device.device_kind!r} (JAX_PLATFORMS="
                        f"{os.environ.get('JAX_PLATFORMS', '')!r}, TPU chips found: {mesh.tpu_chips_attached()}); "
                        "set JAX_PLATFORMS=tpu to require one, or run bench.device with --dry-run")
    stats = device.memory_stats() or {}
    bytes_limit = stats.get("bytes_limit")
    inputs = inputs_lib.build_inputs(args.workdir)
    model_config = models.model_config(args.model, vocab_size=inputs.tokenizer.vocab_size)
    schedule = Schedule(*args.schedule)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    training = args.training if args.side == "ours" else "full"
    first = lambda training: args.batch if args.exact_batch else first_batch(  # noqa: E731
        args.side, model_config, seq_len=args.seq_len, training=training, bytes_limit=bytes_limit, cap=args.batch)
    step_options = {"remat": args.remat, "vocab_chunk": args.vocab_chunk}
    refusals, choice = [], None
    try:
        if training == "auto":
            measured_steps = schedule.warmup_steps + schedule.repeats * schedule.steps_per_repeat + (PROFILE_STEPS if args.profile else 0)
            training, side, repeats, refused, refusals, choice = auto_training(
                model_config, inputs, first=first, seq_len=args.seq_len, schedule=schedule, log=log, step_options=step_options,
                least_recomputation=step.remat_candidates(args.remat)[0], measured_steps=measured_steps,
                seconds_left=lambda: (args.deadline or math.inf) - time.time())
        else:
            side, repeats, refused = fitted(args.side, model_config, inputs, seq_len=args.seq_len, batch=first(training),
                                            training=training, schedule=schedule, log=log, step_options=step_options)
    except DoesNotFit as refusal:
        return {"side": args.side, "model": args.model, "seq_len": args.seq_len, "does_not_fit": str(refusal),
                "device_kind": device.device_kind, "device_bytes_limit": bytes_limit}
    lora_rank = TRAININGS[training][1] if args.side == "ours" else 0
    # How ours came to train this way: the compiler's verdict on each option before it.
    chosen = training_label(training) + (f" (the compiler refused {'; '.join(refusals)})" if refusals else "")
    step_s = statistics.median(repeats.step_times)
    flops_per_token = flops.training_flops_per_token(model_config, args.seq_len, lora_rank=lora_rank)
    positions_per_step = side.batch_size * args.seq_len
    chip = hardware.CHIPS.get(device.device_kind)
    peak = chip.peak_bf16_flops if chip else None
    costs = side.cost_analysis()
    bound = roofline(side.hlo_text(), flops_per_token * positions_per_step / jax.device_count(), chip)
    analysis = side.memory_analysis()
    result = {
        "side": args.side, "model": args.model, "seq_len": args.seq_len, "batch": side.batch_size, "batches_refused": refused,
        "training": chosen, **(choice.figures() if choice else {}), **side.step_choices(),
        "parameters": flops.param_count(model_config), "device_kind": device.device_kind, "devices": jax.device_count(),
        "compile_s": side.compile_s, "step_s": step_s, "step_spread": spread(repeats.step_times),
        "repeats": len(repeats.step_times), "steps_per_repeat": schedule.steps_per_repeat,
        "useful_tokens_per_s": repeats.useful_tokens_per_sec, "positions_per_s": repeats.positions_per_sec,
        "padding": repeats.padding_fraction,
        # MFU of the useful tokens (what a user's data gets), and of every position computed, padding included
        **mfu_figures(repeats, flops_per_token, peak),
        "model_flops_per_step": flops_per_token * positions_per_step,
        "compiler_flops_per_step": costs.get("flops"), "compiler_bytes_per_step": costs.get("bytes accessed"),
        **bound, "measured_over_bound": step_s / bound["bound_s"] if bound["bound_s"] else None,
        "compiled_step_bytes": side.step_memory_bytes(),
        "compiled_temp_bytes": analysis.temp_size_in_bytes if analysis else None,
        "device_peak_bytes": (device.memory_stats() or {}).get("peak_bytes_in_use"), "device_bytes_limit": bytes_limit,
        "truncated_away": side.truncated_fraction(),
    }
    if args.profile:
        result["profile"] = [dataclasses.asdict(row) for row in profiled(side, step_s)]
    side.close()
    return result


def profiled(side: Side, step_s: float) -> list[step_profile.Row]:
    """PROFILE_STEPS steps back to back under the profiler, as the table of where their time went."""
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        for _ in range(PROFILE_STEPS):
            side.step()
        side.wait()
        jax.profiler.stop_trace()
        return step_profile.profile_table(trace_dir, side.hlo_text(), steps=PROFILE_STEPS, step_s=step_s)


@mesh.jax_entry_point("bench.device_side: ")
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.device_side", description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=("ours", "baseline"), required=True)
    add_case_arguments(parser, batch_help="the largest global batch tried: the first is the estimate of what fits, halved "
                       "while it does not", accelerator_help="refuse to measure on the CPU")
    parser.add_argument("--schedule", type=int, nargs=3, metavar=("WARMUP", "REPEATS", "STEPS"), required=True)
    parser.add_argument("--training", choices=("auto", *TRAININGS), default="auto",
                        help="what ours trains; auto: the fastest of full (float32), lean and lean-factored (bfloat16 state) that the "
                        "compiler fits, by its bound (the first that fits on the CPU), LoRA where none does")
    parser.add_argument("--deadline", type=float, help="when the figures must be written, in seconds since the epoch "
                        "(bench.device's --time-limit): --training auto compiles no further candidate than the time left allows")
    parser.add_argument("--exact-batch", action="store_true", help="start at --batch itself, not at the estimate of what fits")
    parser.add_argument("--profile", action="store_true", help="trace a few steps after the timing: where their time went")
    return write_result(run, parser.parse_args(argv))


def add_case_arguments(parser: argparse.ArgumentParser, *, batch_help: str, accelerator_help: str) -> None:
    """The flags bench.device gives every side's process: the case, the step's choices, where figures go."""
    parser.add_argument("--model", required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True, help=batch_help)
    parser.add_argument("--remat", choices=config_lib.REMATS, default="auto", help="ours' --remat")
    parser.add_argument("--vocab-chunk", type=config_lib.vocab_chunk_option, default="auto", help="ours' --vocab-chunk")
    parser.add_argument("--result", required=True, help="JSON file the figures are written to")
    parser.add_argument("--workdir", default=inputs_lib.DEFAULT_WORKDIR)
    parser.add_argument("--accelerator", action="store_true", help=accelerator_help)


def write_result(measure, args) -> int:
    """A side's figures, `measure(args)`, as JSON in --result (written only once measured: a side that fails
    leaves no file, not an empty one)."""
    figures = measure(args)
    with open(args.result, "w") as out:
        json.dump(figures, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
