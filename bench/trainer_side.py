"""The accelerator benchmark's third side: `python -m trainer` itself, started as a user starts it.

`python -m bench.trainer_side --model gemma3-1b --seq-len 1024 --batch 8 --training lean-factored --remat dots
--result R.json` generates a chat JSONL and its tokenizer (bench.inputs.build_chat_inputs, cached in --workdir),
runs the trainer on them in a process of its own (random weights, no eval, no samples), and reads its steady
throughput from the run's metrics.jsonl: the median of its reports after the first timed one (each report
times the steps since the report before). `ours` (bench.device_side) times the same step built in-process;
the two step times side by side say whether the run a user starts is the run the benchmark measured.

`--restart` measures what a preemption costs: the run is told to stop (SIGTERM) once it reports half its
steps, checkpoints and exits, and is started again in the same run folder with the same command, so that it
resumes and trains on (with a --trainer-arg=--compilation-cache-dir, the same programs read back). Each
start's time to its first step (its goodput events: process start to the loop's start, restore included),
the part of it goodput books as compiling, and the trainer's compilation cache line are in `starts`, and
`restart_over_first` is the second's time to its first step over the first's.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from bench import inputs as inputs_lib
from bench.device_side import TRAININGS, add_case_arguments, training_label, write_result
from trainer import contract
from trainer.errors import UserError
from trainer.measure import goodput_accounting
from trainer.measure.run_events import EVENTS_DIR, read_attempts
from trainer.run.mesh import jax_entry_point
from trainer.run.metrics import METRICS_FILE, read_metrics

STEPS, LOG_INTERVAL = 40, 5  # reports at steps 1, 5, 10, ...: the first times nothing (compile), the second is warm-up
POLL_S = 0.2  # --restart: how often the first start's metrics are read for the step it is stopped after


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


def starts(run_dir: pathlib.Path, cache_lines: list[str | None]) -> list[dict]:
    """Each start of the run, in order: its time to its first step (process start to the loop's start: its
    goodput events' `ready`), of which goodput books `program_startup_s` as compiling and `restore_s` as
    restoring, its spans before the first step by name (inputs, weights, restore, compile: seconds), and the
    trainer's compilation cache line (None without --compilation-cache-dir)."""
    attempts = sorted(read_attempts(run_dir / EVENTS_DIR), key=lambda events: events[0]["time"])
    figures = []
    for events, cache_line in zip(attempts, cache_lines, strict=True):
        seconds = goodput_accounting.account([events]).seconds
        ready = next(event for event in events if event["event"] == "ready")
        spans = {event["event"]: event["seconds"] for event in events if "seconds" in event and event["time"] <= ready["time"]}
        figures.append({"start_step": ready["start_step"], "before_first_step_s": ready["time"] - events[0]["time"],
                        "program_startup_s": seconds["PROGRAM_STARTUP"],
                        "restore_s": seconds["UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"], "spans": spans, "compilation_cache": cache_line})
    return figures


def figures(args, run_dir: pathlib.Path, wall_s: float, cache_lines: list[str | None]) -> dict:
    """What the run's own files say of it: its steady throughput (metrics.jsonl), its choices (config.json) and
    its starts (goodput events; the first start's are the top-level figures)."""
    reports = steady(read_metrics(run_dir / METRICS_FILE))
    resolved = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    step_s = statistics.median(report["step_time_s"] for report in reports)
    mfus = [report["mfu"] for report in reports if report.get("mfu") is not None]
    each_start = starts(run_dir, cache_lines)
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
        "program_startup_s": each_start[0]["program_startup_s"], "before_first_step_s": each_start[0]["before_first_step_s"],
        "starts": each_start, "restart_over_first": (each_start[1]["before_first_step_s"] / each_start[0]["before_first_step_s"]
                                                     if len(each_start) > 1 else None),
        "run_wall_s": wall_s, "trainer_args": args.trainer_args,
    }


def reported_step(run_dir: pathlib.Path) -> int:
    """The last step metrics.jsonl reports so far (0 before its first report; a line being written is skipped)."""
    try:
        text = (run_dir / METRICS_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return 0
    steps = [json.loads(line).get("step", 0) for line in text.splitlines(keepends=True) if line.endswith("\n") and line.strip()]
    return max(steps, default=0)


def start(command: list[str], env: dict, *, run_dir: pathlib.Path, number: int, stop_after: int | None) -> str | None:
    """One start of the trainer; with `stop_after`, told to stop (SIGTERM, as a preemption) once it reports
    that step, when it must checkpoint and exit RETRY. Its stderr is kept to be read and echoed; returns its
    compilation cache line."""
    log = run_dir.parent / f"{run_dir.name}-start-{number}.stderr"
    with open(log, "w", encoding="utf-8") as stderr:
        process = subprocess.Popen(command, env=env, stderr=stderr)
        while stop_after is not None and process.poll() is None and reported_step(run_dir) < stop_after:
            time.sleep(POLL_S)
        if stop_after is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
        returncode = process.wait()
    text = log.read_text(encoding="utf-8", errors="replace")
    print(text, end="", file=sys.stderr, flush=True)
    expected = 0 if stop_after is None else contract.RETRY
    if returncode != expected:
        ended = "" if returncode else f"; it ended before it was stopped after step {stop_after}: raise --steps"
        raise UserError(f"python -m trainer (start {number}) exited {returncode}, not {expected} (its error is above){ended}")
    return next((line.removeprefix("trainer: ") for line in text.splitlines() if line.startswith("trainer: compilation cache")), None)


def run(args) -> dict:
    data, tokenizer = inputs_lib.build_chat_inputs(args.workdir)
    with tempfile.TemporaryDirectory(dir=args.workdir) as run_dir:
        run_dir = pathlib.Path(run_dir) / "run"
        command = trainer_command(args, data=data, tokenizer=tokenizer, workdir=str(run_dir))
        print("[trainer side] " + " ".join(command[1:]), file=sys.stderr, flush=True)
        env = {**os.environ, **({"JAX_PLATFORMS": "tpu"} if args.accelerator else {})}
        began = time.perf_counter()
        stops = [args.steps // 2, None] if args.restart else [None]
        cache_lines = [start(command, env, run_dir=run_dir, number=number, stop_after=stop)
                       for number, stop in enumerate(stops, 1)]
        return figures(args, run_dir, time.perf_counter() - began, cache_lines)


@jax_entry_point("bench.trainer_side: ")
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trainer_side", description=__doc__.splitlines()[0])
    add_case_arguments(parser, batch_help="the run's --batch-size (global rows a step)",
                       accelerator_help="the trainer must run on the accelerator (JAX_PLATFORMS=tpu)")
    parser.add_argument("--training", choices=tuple(TRAININGS), default="full")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--trainer-arg", dest="trainer_args", action="append", default=[],
                        help="one more flag for python -m trainer, as --trainer-arg=--grad-accum-steps=4 (repeatable)")
    parser.add_argument("--restart", action="store_true", help="stop the run (SIGTERM) after half its steps and start it again "
                        "in the same run folder: each start's time to its first step (see the module docstring)")
    return write_result(run, parser.parse_args(argv))

if __name__ == "__main__":
    sys.exit(main())
