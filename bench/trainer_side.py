"""The accelerator benchmark's third side: `python -m trainer` itself, started as a user starts it.

`python -m bench.trainer_side --model gemma3-1b --seq-len 1024 --batch 8 --training lean-factored --remat dots
--result R.json` generates a chat JSONL and its tokenizer (bench.inputs.build_chat_inputs, cached in --workdir),
runs the trainer on them in a process of its own (random weights, no eval, no samples), and reads its steady
throughput from the run's metrics.jsonl: the median of its reports after the first timed one (each report
times the steps since the report before). `ours` (bench.device_side) times the same step built in-process;
the two step times side by side say whether the run a user starts is the run the benchmark measured.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from bench import inputs as inputs_lib
from bench.device_side import TRAININGS, add_case_arguments, training_label, write_result
from trainer.errors import UserError
from trainer.measure import goodput_accounting
from trainer.measure.run_events import EVENTS_DIR, read_attempts
from trainer.run.mesh import jax_entry_point
from trainer.run.metrics import METRICS_FILE, read_metrics

STEPS, LOG_INTERVAL = 40, 5  # reports at steps 1, 5, 10, ...: the first times nothing (compile), the second is warm-up


def trainer_command(args, *, data: pathlib.Path, tokenizer: pathlib.Path, workdir: str) -> list[str]:
    precision, lora_rank = TRAININGS[args.training]
    return [sys.executable, "-m", "trainer", "--model", args.model, "--weights", "random", "--data", str(data),
            "--tokenizer", str(tokenizer), "--seq-len", str(args.seq_len), "--batch-size", str(args.batch),
            "--precision", precision, "--lora-rank", str(lora_rank), "--remat", args.remat, "--vocab-chunk", str(args.vocab_chunk),
            "--steps", str(args.steps), "--log-interval", str(LOG_INTERVAL), "--eval-fraction", "0", "--no-samples",
            "--workdir", workdir, *args.trainer_args]


def steady(records: list[dict]) -> list[dict]:
    """The reports that time warm steps: those with a throughput, less the first of them."""
    timed = [record for record in records if "step_time_s" in record]
    if len(timed) < 2:
        raise UserError(f"the run reported {len(timed)} timed intervals; raise --steps (at least {3 * LOG_INTERVAL})")
    return timed[1:]


def figures(args, run_dir: pathlib.Path, wall_s: float) -> dict:
    """What the run's own files say of it: its steady throughput (metrics.jsonl) and its choices (config.json)."""
    reports = steady(read_metrics(run_dir / METRICS_FILE))
    resolved = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    step_s = statistics.median(report["step_time_s"] for report in reports)
    mfus = [report["mfu"] for report in reports if report.get("mfu") is not None]
    startup = goodput_accounting.account(read_attempts(run_dir / EVENTS_DIR)).seconds
    return {
        "side": "trainer", "model": args.model, "seq_len": args.seq_len, "batch": args.batch,
        "training": training_label(args.training), "remat": resolved["remat_policy"], "vocab_chunk": resolved["vocab_chunk"],
        "device_kind": resolved["device_kind"], "step_s": step_s, "reports": len(reports),
        "positions_per_s": args.batch * args.seq_len / step_s,
        # tokens the trainer counts: non-padding positions (prompts included; bench.device_side counts loss targets)
        "tokens_per_s": statistics.median(report["tokens_per_sec"] for report in reports),
        "mfu": statistics.median(mfus) if mfus else None,
        # the trainer's own figure before step 1: bytes in use plus what the compiled step adds (trainer.run.hbm.before_first_step)
        "device_peak_bytes": (resolved.get("device_memory") or {}).get("peak_bytes"),
        # what goodput books as compiling (a --compilation-cache-dir hit shows here) and everything before step 1
        "program_startup_s": startup["PROGRAM_STARTUP"], "before_first_step_s": startup["TPU_INITIALIZATION"] + startup["TRAINING_PREP"]
        + startup["PROGRAM_STARTUP"], "run_wall_s": wall_s, "trainer_args": args.trainer_args,
    }


def run(args) -> dict:
    data, tokenizer = inputs_lib.build_chat_inputs(args.workdir)
    with tempfile.TemporaryDirectory(dir=args.workdir) as run_dir:
        command = trainer_command(args, data=data, tokenizer=tokenizer, workdir=run_dir)
        print("[trainer side] " + " ".join(command[1:]), file=sys.stderr, flush=True)
        env = {**os.environ, **({"JAX_PLATFORMS": "tpu"} if args.accelerator else {})}
        start = time.perf_counter()
        process = subprocess.run(command, env=env)
        wall_s = time.perf_counter() - start
        if process.returncode != 0:
            raise UserError(f"python -m trainer exited {process.returncode} (its error is above)")
        return figures(args, pathlib.Path(run_dir), wall_s)


@jax_entry_point("bench.trainer_side: ")
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trainer_side", description=__doc__.splitlines()[0])
    add_case_arguments(parser, batch_help="the run's --batch-size (global rows a step)",
                       accelerator_help="the trainer must run on the accelerator (JAX_PLATFORMS=tpu)")
    parser.add_argument("--training", choices=tuple(TRAININGS), default="full")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--trainer-arg", dest="trainer_args", action="append", default=[],
                        help="one more flag for python -m trainer, as --trainer-arg=--grad-accum-steps=4 (repeatable)")
    return write_result(run, parser.parse_args(argv))

if __name__ == "__main__":
    sys.exit(main())
