"""Ours against the tutorial's method on the accelerator this machine has: `python -m bench.device --out R.json`.

Gemma 3 architectures with random weights and their full 262,144-entry vocabulary, on the benchmark's
generated corpus and 512-piece tokenizer (no download). Each case (model, sequence length) runs each
side in a process of its own (bench.device_side), one after the other, since a TPU admits one program
at a time: from an estimate of the batch that fits, halved while the step does not fit the device's memory, then
3 warm-up steps and 4 repeats of 5 steps (median). Ours is the trainer's own step: with --training auto
the fastest full fine-tune (float32, --precision lean or lean-factored) that the compiler fits in the chip's memory
at some batch, by the compiled step's bound (bench.training_choice), LoRA where none does, and the figures say
which, what it was compared with and what was refused; the baseline is the
tutorial's method (bfloat16 weights, full fine-tune). `--profile` adds, per side, the table of where a
few traced steps' time went (trainer.measure.step_profile). Per case and side: useful
tokens/s, MFU, step time, compiled step memory against the device's peak, the compiler's roofline
bound against the measured step; per case the ratio ours/baseline of useful tokens/s. The whole run
keeps to --time-limit: a side that would start past it, or runs over it, is skipped and said so.
The figures go to --out (JSON, written whole or not at all) and a table is printed.

`--dry-run` does the same on the CPU with the tiny model, one small case, in seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

import jax

from bench import inputs as inputs_lib
from bench.device_side import TRAININGS
from trainer import config as config_lib
from trainer.measure import step_profile
from trainer.run.mesh import jax_entry_point
from trainer.shared_files import replaced_atomically


@dataclasses.dataclass(frozen=True)
class Case:
    model: str
    seq_len: int
    batch: int  # the largest global batch tried (bench.device_side.first_batch)


# Sized for one 16 GiB TPU v5e chip; a larger device starts from the same batches.
CASES = (Case("gemma3-270m", 1024, 64), Case("gemma3-1b", 1024, 32), Case("gemma3-1b", 4096, 8))
DRY_RUN_CASES = (Case("tiny", 64, 8),)
SCHEDULE = (3, 4, 5)  # warm-up steps, repeats, steps per repeat
DRY_RUN_SCHEDULE = (1, 2, 2)
SIDES = ("ours", "baseline")
TRAINER = "trainer"  # python -m trainer itself (bench.trainer_side): asked for with --side trainer
TIME_LIMIT_S = 480
MIN_SIDE_S = 45  # a side that cannot have this long before the limit is not started
# A TPU can refuse a program started just after another ended (libtpu's lock file): a side that fails this
# early is started once more after a pause.
EARLY_FAILURE_S, RETRY_PAUSE_S = 30, 5


def case_name(case: Case) -> str:
    return f"{case.model}@{case.seq_len}"


def run_side(side: str, case: Case, *, schedule, workdir: str, timeout: float, accelerator: bool, options=()) -> dict:
    """One side of `case` in its own process; its figures, or why there are none. `options`: more of
    bench.device_side's flags."""
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        if side == TRAINER:
            command = [sys.executable, "-m", "bench.trainer_side", "--model", case.model, "--seq-len", str(case.seq_len),
                       "--batch", str(case.batch), *options]
        else:
            command = [sys.executable, "-m", "bench.device_side", "--side", side, "--model", case.model,
                       "--seq-len", str(case.seq_len), "--batch", str(case.batch), "--schedule", *map(str, schedule),
                       "--deadline", str(time.time() + timeout), *options]
        command += ["--result", result, "--workdir", workdir, *(["--accelerator"] if accelerator else [])]
        start = time.perf_counter()
        try:
            process = subprocess.run(command, timeout=timeout)
            if process.returncode != 0 and time.perf_counter() - start < EARLY_FAILURE_S:
                time.sleep(RETRY_PAUSE_S)
                process = subprocess.run(command, timeout=timeout - (time.perf_counter() - start))
        except subprocess.TimeoutExpired:
            return {"side": side, "skipped": f"ran past the time limit after {time.perf_counter() - start:.0f} s"}
        if process.returncode != 0 or not os.path.exists(result):
            return {"side": side, "failed": f"exit {process.returncode} (its error is above)"}
        with open(result) as figures:
            return json.load(figures)


def ratio(results: dict) -> float | None:
    ours, baseline = results.get("ours", {}), results.get("baseline", {})
    if "useful_tokens_per_s" in ours and "useful_tokens_per_s" in baseline:
        return ours["useful_tokens_per_s"] / baseline["useful_tokens_per_s"]
    return None


def trainer_over_ours(results: dict) -> float | None:
    """The trainer's speed as a fraction of ours' at the same batch: the inverse ratio of their step times (their
    data differ, chat rows against stories, so their token counts do not compare)."""
    ours, trainer = results.get("ours", {}), results.get(TRAINER, {})
    if "step_s" in ours and "step_s" in trainer and ours["batch"] == trainer["batch"]:
        return ours["step_s"] / trainer["step_s"]
    return None


def percent(value) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def gib(value) -> str:
    return "n/a" if value is None else f"{value / 2**30:.2f} GiB"


def print_table(cases: list[dict]) -> None:
    print("| model | seq | side | training | batch | useful tok/s | MFU | step | compiled step | device peak | bound | measured/bound |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for case in cases:
        for side in (*SIDES, TRAINER):
            r = case["sides"].get(side, {})
            if not r:
                continue
            if side == TRAINER:
                print_trainer_row(case, r)
                continue
            if "step_s" not in r:
                print(f"| {case['model']} | {case['seq_len']} | {side} | {r.get('skipped') or r.get('failed') or r.get('does_not_fit')} |||||||||")
                continue
            bound = "n/a" if r["bound_s"] is None else f"{r['bound_s'] * 1e3:.0f} ms ({r['bound_by']})"
            over = "n/a" if r["measured_over_bound"] is None else f"{r['measured_over_bound']:.2f}x"
            training = r["training"] + (f", remat {r['remat']}, vocab chunk {r['vocab_chunk'] or 'none'}" if "remat" in r else "")
            print(f"| {case['model']} | {case['seq_len']} | {side} | {training} | {r['batch']} | "
                  f"{r['useful_tokens_per_s']:,.0f} | {percent(r['mfu'])} | {r['step_s'] * 1e3:.0f} ms | "
                  f"{gib(r['compiled_step_bytes'])} | {gib(r['device_peak_bytes'])} | {bound} | {over} |")
        if "training_choice" in case["sides"].get("ours", {}):
            print(f"  {case['model']} @ {case['seq_len']}: ours' {case['sides']['ours']['training_choice']}")
        if case["ours_over_baseline"] is not None:
            print(f"  {case['model']} @ {case['seq_len']}: ours/baseline, useful tokens/s: {case['ours_over_baseline']:.2f}x")
        if case.get("trainer_over_ours") is not None:
            print(f"  {case['model']} @ {case['seq_len']}: python -m trainer / ours, steps per second: {case['trainer_over_ours']:.3f}x")
        if case["sides"].get(TRAINER, {}).get("restart_over_first") is not None:
            first, restart = case["sides"][TRAINER]["starts"]
            print(f"  {case['model']} @ {case['seq_len']}: python -m trainer's restart reached its first step in "
                  f"{restart['before_first_step_s']:.1f} s, {case['sides'][TRAINER]['restart_over_first']:.2f}x the first start's "
                  f"{first['before_first_step_s']:.1f} s (program start-up {first['program_startup_s']:.1f} -> {restart['program_startup_s']:.1f} s)")
    for case in cases:
        for side, r in case["sides"].items():
            if "profile" in r:
                rows = [step_profile.Row(**row) for row in r["profile"]]
                print(step_profile.format_table(rows, title=f"{case['model']} @ {case['seq_len']}, {side} ({r['training']}, "
                                                              f"batch {r['batch']}): where a step's time goes"))


def print_trainer_row(case: dict, r: dict) -> None:
    """python -m trainer's row: its own throughput (tokens: non-padding positions of its chat rows) and the device's peak."""
    if "step_s" not in r:
        print(f"| {case['model']} | {case['seq_len']} | {TRAINER} | {r.get('skipped') or r.get('failed')} |||||||||")
        return
    training = f"{r['training']}, remat {r['remat']}, vocab chunk {r['vocab_chunk'] or 'none'}"
    print(f"| {case['model']} | {case['seq_len']} | {TRAINER} | {training} | {r['batch']} | {r['tokens_per_s']:,.0f} "
          f"(non-padding) | {percent(r['mfu'])} | {r['step_s'] * 1e3:.0f} ms | n/a | {gib(r['device_peak_bytes'])} | n/a | n/a |")


@jax_entry_point("bench.device: ")
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.device", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON file the figures are written to")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, with the tiny model and one small case")
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT_S, help=f"seconds for the whole run (default {TIME_LIMIT_S})")
    parser.add_argument("--workdir", default=inputs_lib.DEFAULT_WORKDIR, help="where the generated inputs are cached")
    parser.add_argument("--case", dest="cases", action="append", choices=[case_name(case) for case in CASES],
                        help="run only this case (repeatable; default all): one invocation's time limit rarely holds them all")
    parser.add_argument("--side", dest="sides", action="append", choices=(*SIDES, TRAINER),
                        help="measure only this side (default ours and baseline); trainer: python -m trainer itself on a chat "
                        "JSONL, with ours' --training, --remat, --vocab-chunk and --batch")
    parser.add_argument("--trainer-arg", dest="trainer_args", action="append", default=[],
                        help="one more flag for the trainer side's python -m trainer, as --trainer-arg=--grad-accum-steps=4")
    parser.add_argument("--trainer-restart", action="store_true", help="the trainer side's run is stopped (SIGTERM) after half its "
                        "steps and started again in its folder: each start's time to its first step (bench.trainer_side --restart)")
    parser.add_argument("--training", choices=("auto", *TRAININGS), default="auto",
                        help="what ours trains: full (float32 state), lean or lean-factored (bfloat16 state), lora; auto: the fastest full "
                        "fine-tune the compiler fits, by its bound (bench.training_choice), LoRA where none does")
    parser.add_argument("--batch", type=int, help="start each side at this global batch (halved while it does not fit) "
                        "instead of the estimate of what fits under the case's cap")
    parser.add_argument("--profile", action="store_true", help="trace a few steps of each side: the table of where their time goes")
    parser.add_argument("--remat", choices=config_lib.REMATS, default="auto", help="ours' --remat (default auto: the trainer's choice)")
    parser.add_argument("--vocab-chunk", type=config_lib.vocab_chunk_option, default="auto", help="ours' --vocab-chunk (default auto: the trainer's choice)")
    args = parser.parse_args(argv)
    options = ["--training", args.training, "--remat", args.remat, "--vocab-chunk", args.vocab_chunk,
               *(["--profile"] if args.profile else []), *(["--exact-batch"] if args.batch else [])]
    if TRAINER in (args.sides or ()) and args.training == "auto":
        parser.error("--side trainer runs one setting: give --training (full, lean, lean-factored or lora)")
    if TRAINER in (args.sides or ()) and not (args.batch or args.dry_run):
        parser.error("--side trainer runs one setting: give --batch (the run's --batch-size)")
    trainer_options = ["--training", args.training, "--remat", args.remat, "--vocab-chunk", str(args.vocab_chunk),
                       *(f"--trainer-arg={flag}" for flag in args.trainer_args), *(["--restart"] if args.trainer_restart else [])]
    start = time.perf_counter()
    # This process only prepares the inputs and starts the sides: it must not hold the chip they need.
    jax.config.update("jax_platforms", "cpu")
    inputs = inputs_lib.build_inputs(args.workdir)
    print(f"  {inputs_lib.length_distribution(inputs, 1024)}", flush=True)
    cases = []
    chosen = DRY_RUN_CASES if args.dry_run else [case for case in CASES if not args.cases or case_name(case) in args.cases]
    for case in chosen:
        results = {}
        if args.batch:
            case = dataclasses.replace(case, batch=args.batch)
        for side in args.sides or SIDES:
            left = args.time_limit - (time.perf_counter() - start)
            if left < MIN_SIDE_S and not args.dry_run:
                results[side] = {"side": side, "skipped": f"not started: {left:.0f} s of the time limit left"}
                continue
            print(f"[device] {case.model} @ {case.seq_len}, {side}: batch at most {case.batch}, {left:.0f} s left", flush=True)
            results[side] = run_side(side, case, schedule=DRY_RUN_SCHEDULE if args.dry_run else SCHEDULE,
                                     workdir=args.workdir, timeout=left, accelerator=not args.dry_run,
                                     options=trainer_options if side == TRAINER else options)
        cases.append({**dataclasses.asdict(case), "sides": results, "ours_over_baseline": ratio(results),
                      "trainer_over_ours": trainer_over_ours(results)})
    report = {"dry_run": args.dry_run, "time_limit_s": args.time_limit, "elapsed_s": time.perf_counter() - start,
              "jax": jax.__version__, "cases": cases}
    with replaced_atomically(args.out) as temporary:
        temporary.write_text(json.dumps(report, indent=1))
    print_table(cases)
    print(f"done in {report['elapsed_s']:.0f} s; figures in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
