"""The README's memory table, from the TPU compiler: `python -m trainer.measure.memory_table`.

Compiles the train step (trainer.measure.compiled) of each model, full and LoRA, on each v6e shape,
at the table's global batch and row length, with FSDP over each slice as the workloads run it; writes
every compile's figures and its step fingerprint to docs/memory-table.json and prints the Markdown
table the README carries, with the formula of trainer.measure.memory beside each figure.
tests/trainer/measure/test_memory_table.py keeps the README equal to the JSON, the formula column
equal to the formula, and the JSON's step equal to the trainer's (its fingerprint): a change to the
step makes that test ask for this command again. A real model's compile takes minutes on 2 cores.

Which step an entry was compiled from: the fingerprint of the REFERENCE entry's step (gemma3-270m
LoRA on one chip, cheap to compile, compiled first in every run of this command) at the time, the
entry's `step`. The table's current step is the reference entry's own fingerprint; an entry of an
older step, one that was not compiled again since the step changed, is marked in the table.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

from trainer.config import GEMMA3_MODELS
from trainer.measure import memory
from trainer.run import hbm
from trainer.run.mesh import jax_entry_point

TABLE_JSON = pathlib.Path(__file__).resolve().parents[2] / "docs" / "memory-table.json"
GLOBAL_BATCH = 128
SEQ_LEN = 256
LORA_RANK = 16
# (topology, slices): one chip, the shipped multi-host slice, a larger slice, and the multislice stack's two.
SHAPES = (("1x1", 1), ("2x4", 1), ("4x4", 1), ("2x4", 2))
REFERENCE = ("gemma3-270m", LORA_RANK, "1x1", 1)  # (model, lora_rank, topology, slices): the entry that names the step
OLDER_STEP_MARK = "†"
_GIB = 2**30


def entry_args(model: str, lora_rank: int, topology: str, slices: int) -> list[str]:
    """The trainer flags of one entry, as the workloads pass them (FSDP over a slice's chips)."""
    chips_per_slice = memory.Shape("v6e", topology).chips
    return ["--model", model, "--weights", "random", "--data", "unused-by-a-compile", "--lora-rank", str(lora_rank),
            "--batch-size", str(GLOBAL_BATCH), "--seq-len", str(SEQ_LEN), "--mesh", f"data=-1,fsdp={chips_per_slice}",
            "--steps", "1000"]


def formula_gib(model: str, lora_rank: int, topology: str, slices: int) -> float:
    """trainer.measure.memory's estimate for the entry, in GiB."""
    from trainer.model import models

    chips = memory.Shape("v6e", topology).chips
    estimate = memory.estimate_bytes_per_chip(models.model_config(model, vocab_size=0), chips=chips, fsdp=chips,
                                              lora_rank=lora_rank, batch_per_chip=GLOBAL_BATCH // (chips * slices),
                                              seq_len=SEQ_LEN)
    return round(estimate["total"] / _GIB, 1)


def entry_key(entry: dict) -> tuple[str, int, str, int]:
    return entry["model"], entry["lora_rank"], entry["topology"], entry["slices"]


def current_step(entries: list[dict]) -> str | None:
    """The fingerprint of the step the table was last compiled from: the reference entry's."""
    return next((e["step_fingerprint"] for e in entries if entry_key(e) == REFERENCE), None)


def is_current(entry: dict, entries: list[dict]) -> bool:
    return entry.get("step") == current_step(entries)


def compile_entry(model: str, lora_rank: int, topology: str, slices: int) -> dict:
    from trainer.config import parse_config
    from trainer.measure import compiled

    config = parse_config(entry_args(model, lora_rank, topology, slices))
    devices = compiled.tpu_devices("v6e", topology, num_slices=slices)
    report = compiled.fit(config, devices, num_slices=slices, search_batch=False).report()
    return {"model": model, "lora_rank": lora_rank, "topology": topology, "slices": slices,
            "compiled_gib": round(report["compiled_bytes_per_chip"] / _GIB, 2), "refused_for": report.get("refused_for"),
            "usable_gib": round(report["usable_hbm_bytes_per_chip"] / _GIB, 2), "fits": report["fits"],
            "remat": report.get("remat"), "attention": report.get("attention"), "vocab_chunk": report.get("vocab_chunk"),
            "mfu_bound": report.get("mfu_bound"), "bound_by": report.get("bound_by"),
            "step_fingerprint": report.get("step_fingerprint"), "formula_gib": formula_gib(model, lora_rank, topology, slices)}


def markdown(entries: list[dict]) -> str:
    rows = ["| model | mode | slice | batch/chip | compiled GiB/chip | formula GiB | fits (compiler) | remat | vocab chunk | MFU bound |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        chips = memory.Shape("v6e", e["topology"]).chips
        mode = f"LoRA r={e['lora_rank']}" if e["lora_rank"] else "full"
        shape = f"v6e {e['topology']}" + (f" x {e['slices']}" if e["slices"] > 1 else "")
        fits = "yes" if e["fits"] else f"no ({_needs(e)} {e['compiled_gib']:.1f} of {e['usable_gib']:.2f})"
        mark = "" if is_current(e, entries) else f" {OLDER_STEP_MARK}"
        rows.append(f"| {e['model']} | {mode} | {shape} | {GLOBAL_BATCH // (chips * e['slices'])} | {e['compiled_gib']:.2f}{mark} | "
                    f"{e['formula_gib']:.1f} | {fits} | {e['remat'] or '-'} | {_chunk(e)} | {_mfu_bound(e)} |")
    if not all(is_current(e, entries) for e in entries):
        rows += ["", f"{OLDER_STEP_MARK} compiled from an older train step than the other rows, not compiled again since "
                     "(`python -m trainer.measure.memory_table --models MODEL --shapes TOPOLOGY/SLICES`)."]
    return "\n".join(rows)


def _needs(entry: dict) -> str:
    """A refusal before compiling (trainer.run.hbm.arguments_refusal) counts the arguments alone."""
    return "its state alone needs" if entry.get("refused_for") == hbm.ARGUMENTS else "needs"


def _mfu_bound(entry: dict) -> str:
    """The compiler's roofline ceiling on MFU (trainer.measure.compiled); rows compiled before it was kept have none."""
    if not entry["fits"]:
        return "-"
    if entry.get("mfu_bound") is None:
        return "n/a"
    return f"{entry['mfu_bound']:.0%} ({entry['bound_by']})"


def _chunk(entry: dict) -> str:
    if not entry["fits"]:
        return "-"
    return "all" if entry["vocab_chunk"] is None else str(entry["vocab_chunk"])


def merged(old: list[dict], new: list[dict]) -> list[dict]:
    """`old` with the entries `new` compiles again replaced, in the table's order (model size, full
    before LoRA, SHAPES)."""
    by_key = {entry_key(e): e for e in old} | {entry_key(e): e for e in new}
    shape_order = {shape: i for i, shape in enumerate(SHAPES)}
    return sorted(by_key.values(), key=lambda e: (list(GEMMA3_MODELS).index(e["model"]), e["lora_rank"],
                                                   shape_order[(e["topology"], e["slices"])]))


def write_entries(entries: list[dict], path: pathlib.Path) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"global_batch": GLOBAL_BATCH, "seq_len": SEQ_LEN, "entries": entries}, indent=1) + "\n")
    temporary.replace(path)


def read_entries(path: pathlib.Path = TABLE_JSON) -> list[dict]:
    return json.loads(path.read_text())["entries"]


@jax_entry_point()
def main(argv=None) -> int | None:
    parser = argparse.ArgumentParser(prog="python -m trainer.measure.memory_table", description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gemma3-270m", "gemma3-1b"], help="models to compile")
    parser.add_argument("--shapes", nargs="+", choices=[f"{topology}/{slices}" for topology, slices in SHAPES],
                        default=[f"{topology}/{slices}" for topology, slices in SHAPES], help="TOPOLOGY/SLICES to compile")
    parser.add_argument("--lora-ranks", nargs="+", type=int, choices=(0, LORA_RANK), default=[0, LORA_RANK],
                        help=f"0 (full fine-tune) and/or {LORA_RANK} (LoRA); a model whose full fine-tune cannot fit a shape "
                             "saves that compile")
    parser.add_argument("--out", type=pathlib.Path, default=TABLE_JSON, help=f"the JSON to write (default {TABLE_JSON})")
    parser.add_argument("--print", dest="print_only", action="store_true", help="print the table of --out without compiling")
    args = parser.parse_args(argv)
    if not args.print_only:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        entries = read_entries(args.out) if args.out.exists() else []
        reference = compile_entry(*REFERENCE)
        step_now = reference["step_fingerprint"]
        entries = merged(entries, [reference | {"step": step_now}])
        write_entries(entries, args.out)
        for model in args.models:
            for rank in args.lora_ranks:
                for shape in args.shapes:
                    topology, slices = shape.split("/")
                    if (model, rank, topology, int(slices)) == REFERENCE:
                        continue
                    entry = compile_entry(model, rank, topology, int(slices)) | {"step": step_now}
                    entries = merged(entries, [entry])
                    write_entries(entries, args.out)  # after each compile: minutes of work are not lost
    print(markdown(read_entries(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
