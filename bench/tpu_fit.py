"""The training step compiled for a v6e slice on this host (libtpu, no TPU), over a grid of models,
modes and sequence lengths: compiled GiB per chip, FLOPs and bytes per chip, the roofline-bound MFU
and the largest global batch that fits. The figures of BENCHMARKS.md's "TPU step, by the compiler".

    python -m bench.tpu_fit                       # gemma3-270m and gemma3-1b, full and LoRA, seq 1024 and 8192, v6e 2x4
    python -m bench.tpu_fit --model gemma3-270m --seq-len 1024 --lora-rank 0 --attention dense

Each line is one compile's report as JSON (the keys of `python -m workloads fit --json`), then a table.
A real model's compile takes minutes on 2 cores; the grid takes about an hour.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

import jax

from trainer.run.mesh import jax_entry_point


@jax_entry_point("bench.tpu_fit: ")
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tpu_fit", description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="default: gemma3-270m and gemma3-1b")
    parser.add_argument("--lora-rank", action="append", type=int, help="default: 0 (full) and 8")
    parser.add_argument("--seq-len", action="append", type=int, help="default: 1024 and 8192")
    parser.add_argument("--batch-size", type=int, default=16, help="global batch of the first compile (default 16)")
    parser.add_argument("--topology", default="2x4")
    parser.add_argument("--accelerator", default="v6e")
    parser.add_argument("--no-batch-search", dest="search_batch", action="store_false")
    parser.add_argument("--extra", action="append", default=[], help="a trainer flag for every run, e.g. --extra=--remat=full")
    parser.add_argument("--images-per-row", type=int, default=0,
                        help="a vision-language run: each row holds this many images (gemma3-4b and larger; default 0, text)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    jax.config.update("jax_platforms", "cpu")  # it compiles for the TPU slice it describes and runs nothing

    from trainer.config import parse_config
    from trainer.measure import compiled

    devices = compiled.tpu_devices(args.accelerator, args.topology)
    reports = []
    for model, rank, seq_len in itertools.product(args.model or ["gemma3-270m", "gemma3-1b"], args.lora_rank or [0, 8],
                                                  args.seq_len or [1024, 8192]):
        config = parse_config(["--model", model, "--weights", "random", "--data", "unused-by-a-compile", "--lora-rank", str(rank), "--seq-len", str(seq_len),
                               "--batch-size", str(args.batch_size), "--mesh", f"data=-1,fsdp={len(devices)}", "--steps", "1000",
                               *args.extra])
        started = time.perf_counter()
        report = compiled.fit(config, devices, search_batch=args.search_batch, images_per_row=args.images_per_row).report()
        report["compile_s"] = round(time.perf_counter() - started, 1)
        print(json.dumps(report), flush=True)
        reports.append(report)
    print(table(reports))
    return 0


def table(reports: list[dict]) -> str:
    gib = 2**30
    lines = ["| model | mode | seq | batch | compiled GiB/chip | TFLOP/chip | GB/chip | MFU bound | largest batch |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        mode = f"LoRA r{r['lora_rank']}" if r["lora_rank"] else "full"
        if "flops_per_chip_per_step" in r:
            cost = f"{r['flops_per_chip_per_step'] / 1e12:.1f} | {r['bytes_accessed_per_chip'] / 1e9:.1f} | {r['mfu_bound']:.0%}"
        else:
            cost = f"does not fit ({r['refused_for']}) | - | -"
        lines.append(f"| {r['model']} | {mode} | {r['seq_len']} | {r['batch_size']} | {r['compiled_bytes_per_chip'] / gib:.2f} | "
                     f"{cost} | {r['largest_batch']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
