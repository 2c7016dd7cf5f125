"""The data side alone: `python -m bench.data_pipeline [--quick]`.

- prepare throughput (MB/s of raw text) for 1, the CPU count and twice the CPU count of tokenizer threads;
- prepare throughput on JSONL chat rows (rows/s and tokens/s; Gemma's chat template, loss mask on the
  model's turns), with a tokenizer trained for chat;
- peak memory (RSS) of `python -m trainer.data.prepare` on a large generated input (2 GB; --quick: 64 MB);
- loader throughput (trainer.data.loader.batches, without its background prefetch) against the time one
  training step of ours takes on the same batch shape;
- packing fill: the share of positions that carry a training token, ours against one document per row.

The large inputs repeat the benchmark corpus (a few MB) end to end: as costly to tokenize as fresh
stories, and written at disk speed.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

from bench import inputs as inputs_lib
from bench.baseline import tokenize_row
from bench.stats import mib
from trainer.data import loader as data_lib
from trainer.data.chat_corpus import write_chat_corpus
from trainer.data.prepare import prepare
from trainer.data.tokenizer import load_tokenizer, train_tokenizer
from trainer.measure import flops
from trainer.model import models
from trainer.run import hardware
from trainer.run.mesh import jax_entry_point

_MB = 10**6
PREPARE_SCALING_MB = {"full": 128, "quick": 16}
PREPARE_MEMORY_MB = {"full": 2000, "quick": 64}
PREPARE_CHAT_MB = {"full": 128, "quick": 16}
# The generated chat corpus repeated into the chat input, and its tokenizer's training set.
CHAT_CONVERSATIONS = 20_000
LOADER_BATCHES = {"full": 50, "quick": 10}
# Rows x sequence of the packing fill report: the tutorial's batch and sequence.
FILL_SHAPE = (128, 256)
TARGET_MFU = 0.4  # the target for ours on Gemma 3 270M at sequence 1024 on an H200: the loader's yardstick


def repeated_text(source: pathlib.Path, path: pathlib.Path, megabytes: int) -> pathlib.Path:
    """`source` repeated end to end until `path` holds at least `megabytes` MB (reused when it does)."""
    target = megabytes * _MB
    if path.exists() and path.stat().st_size >= target:
        return path
    block = source.read_bytes()
    with path.open("wb") as out:
        for _ in range(-(-target // len(block))):
            out.write(block)
    return path


def prepare_scaling(inputs: inputs_lib.BenchInputs, workdir: pathlib.Path, megabytes: int) -> None:
    text = repeated_text(inputs.corpus_path, workdir / f"text-{megabytes}MB.txt", megabytes)
    size_mb = text.stat().st_size / _MB
    cpus = os.cpu_count() or 1
    print(f"[prepare throughput] {size_mb:.0f} MB of text, tokenizer {inputs.tokenizer.vocab_size} pieces, {cpus} CPUs")
    single = None
    for workers in sorted({1, cpus, 2 * cpus}):
        output = workdir / f"prepared-{megabytes}MB-{workers}w"
        shutil.rmtree(output, ignore_errors=True)
        start = time.perf_counter()
        prepare(text, inputs.tokenizer, output, workers=workers)
        rate = size_mb / (time.perf_counter() - start)
        single = single or rate
        print(f"  workers {workers}: {rate:6.1f} MB/s ({rate / single:.2f}x one worker)")
        shutil.rmtree(output)


def prepare_chat(workdir: pathlib.Path, megabytes: int) -> None:
    """trainer.data.prepare on JSONL chat rows (the generated chat corpus repeated), default loss on completions."""
    conversations = workdir / f"chat-{CHAT_CONVERSATIONS}.jsonl"
    if not conversations.exists():
        write_chat_corpus(conversations, num_conversations=CHAT_CONVERSATIONS, seed=0)
    tokenizer_path = workdir / "chat-tokenizer.model"
    if not tokenizer_path.exists():
        train_tokenizer(conversations, tokenizer_path, vocab_size=512, seed=0)
    rows = repeated_text(conversations, workdir / f"chat-{megabytes}MB.jsonl", megabytes)
    size_mb = rows.stat().st_size / _MB
    workers = os.cpu_count() or 1
    output = workdir / f"prepared-chat-{megabytes}MB"
    shutil.rmtree(output, ignore_errors=True)
    start = time.perf_counter()
    tokenizer = load_tokenizer(tokenizer_path)
    meta = prepare(rows, tokenizer, output, workers=workers)
    seconds = time.perf_counter() - start
    print(f"[prepare chat] {size_mb:.0f} MB of JSONL chat rows ({meta['data_format']}, loss on {meta['loss_on']}), "
          f"tokenizer {tokenizer.vocab_size} pieces, {workers} workers: "
          f"{meta['documents'] / seconds:,.0f} rows/s, {meta['tokens'] / seconds:,.0f} tokens/s, {size_mb / seconds:.1f} MB/s "
          f"({meta['documents']:,} rows, {meta['tokens']:,} tokens, {seconds:.0f} s)")
    shutil.rmtree(output)


# Runs argv[1:] and prints the child's peak RSS in KiB (Linux).
_PEAK_RSS_OF_CHILD = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def prepare_memory(inputs: inputs_lib.BenchInputs, workdir: pathlib.Path, megabytes: int) -> None:
    text = repeated_text(inputs.corpus_path, workdir / f"text-{megabytes}MB.txt", megabytes)
    output = workdir / f"prepared-{megabytes}MB"
    shutil.rmtree(output, ignore_errors=True)
    command = [sys.executable, "-m", "trainer.data.prepare", "--input", str(text), "--tokenizer", inputs.tokenizer.path,
               "--output", str(output)]
    start = time.perf_counter()
    # A child forked from this (large, JAX-holding) process would count our pages in its peak RSS
    # until it execs; a small Python in between forks the measured command from a small image.
    measured = subprocess.run([sys.executable, "-c", _PEAK_RSS_OF_CHILD, *command], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if measured.returncode != 0:
        raise SystemExit(f"python -m trainer.data.prepare failed on {text} (exit {measured.returncode}): {measured.stderr.strip()}")
    output_bytes = sum(f.stat().st_size for f in output.iterdir())
    size = text.stat().st_size
    print(f"[prepare memory] python -m trainer.data.prepare (default workers) on {size / _MB:,.0f} MB: peak RSS "
          f"{mib(int(measured.stdout.split()[-1]) * 1024)}, {size / _MB / seconds:.1f} MB/s, {seconds:.0f} s, "
          f"output {output_bytes / _MB:,.0f} MB")
    shutil.rmtree(output)


def loader_throughput(data: data_lib.TokenizedData, *, seq_len: int, batch_size: int, batches: int) -> float:
    """Seconds per batch of the loader producing on the calling thread (no prefetch)."""
    iterator = data_lib.batches(data, seq_len=seq_len, global_batch_size=batch_size, seed=0, prefetch=False)
    next(iterator)  # opening the shards
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return (time.perf_counter() - start) / batches


def loader_vs_step(inputs: inputs_lib.BenchInputs, step_seconds: dict[str, tuple[int, int, float]], batches: int) -> None:
    """`step_seconds`: config name -> (seq_len, batch_size, median step time of ours). Also what an H200 at the
    issue's MFU target would consume on Gemma 3 270M at the tutorial's shape, against this loader on this CPU."""
    print("[loader] trainer.data.loader.batches on one thread, against one train step of ours on the same shape")
    for name, (seq_len, batch_size, step_time) in step_seconds.items():
        per_batch = loader_throughput(inputs.data, seq_len=seq_len, batch_size=batch_size, batches=batches)
        print(f"  {name} (seq_len {seq_len}, batch {batch_size}): {1 / per_batch:8.1f} batches/s "
              f"({batch_size * seq_len / per_batch:,.0f} positions/s), step {step_time * 1e3:.0f} ms: "
              f"loader {step_time / per_batch:,.0f}x faster than the step")
    batch_size, seq_len = FILL_SHAPE
    per_batch = loader_throughput(inputs.data, seq_len=seq_len, batch_size=batch_size, batches=batches)
    gemma = models.model_config("gemma3-270m", vocab_size=inputs.tokenizer.vocab_size)
    needed = TARGET_MFU * hardware.peak_bf16_flops("NVIDIA H200") / flops.training_flops_per_token(gemma, seq_len)
    made = batch_size * seq_len / per_batch
    print(f"  Gemma 3 270M on an H200 at {TARGET_MFU:.0%} MFU (seq_len {seq_len}) would consume {needed:,.0f} positions/s; "
          f"this loader makes {made:,.0f} at batch {batch_size}: {made / needed:.1f}x")


def _fill(batches) -> float:
    filled = positions = 0
    for batch in batches:
        filled += int(batch["loss_mask"].sum())
        positions += batch["loss_mask"].size
    return filled / positions


def packing_fill(inputs: inputs_lib.BenchInputs, *, seq_len: int, batch_size: int) -> None:
    """Ours over one finite pass (its last batches pad the streams that ran out), and in the steady state of a long
    run (the second epoch of an endless stream: the first one's opening batches only emit rows that happen to fill)."""
    epoch = data_lib.steps_per_epoch(inputs.data, seq_len=seq_len, global_batch_size=batch_size)
    one_pass = _fill(data_lib.batches(inputs.data, seq_len=seq_len, global_batch_size=batch_size, seed=0, epochs=1,
                                      prefetch=False))
    endless = data_lib.batches(inputs.data, seq_len=seq_len, global_batch_size=batch_size, seed=0, prefetch=False)
    for _ in range(epoch):
        next(endless)
    steady = _fill(next(endless) for _ in range(epoch))
    documents = inputs.documents()
    rows, cut = zip(*(tokenize_row(inputs.tokenizer, text, seq_len) for text in documents))
    targets = np.stack(rows)[:, 1:]
    one_per_row = float(np.mean(targets != inputs.tokenizer.pad_id))
    kept = 1 - sum(cut) / (sum(cut) + np.count_nonzero(targets != inputs.tokenizer.pad_id))
    print(f"[packing fill] seq_len {seq_len}, batch {batch_size}: share of positions that train: ours {steady:.1%} "
          f"in a long run, {one_pass:.1%} over one pass of {epoch} batches ({inputs.data.documents // batch_size} documents "
          f"per stream); one document per row {one_per_row:.1%}, which also truncates {1 - kept:.1%} of the tokens away")


def run(inputs: inputs_lib.BenchInputs, workdir: pathlib.Path, *, quick: bool, step_seconds) -> None:
    mode = "quick" if quick else "full"
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"  {inputs_lib.length_distribution(inputs, FILL_SHAPE[1])}")
    batch_size, seq_len = FILL_SHAPE
    packing_fill(inputs, seq_len=seq_len, batch_size=batch_size)
    loader_vs_step(inputs, step_seconds, LOADER_BATCHES[mode])
    prepare_scaling(inputs, workdir, PREPARE_SCALING_MB[mode])
    prepare_chat(workdir, PREPARE_CHAT_MB[mode])
    prepare_memory(inputs, workdir, PREPARE_MEMORY_MB[mode])


def measure_step_seconds(inputs: inputs_lib.BenchInputs, *, quick: bool) -> dict[str, tuple[int, int, float]]:
    """Ours alone on each throughput configuration (when not measured by `python -m bench`)."""
    from bench import throughput
    from bench.ours import Ours

    measured = {}
    for config in throughput.CONFIGS.values():
        model_config = config.model_config(inputs.tokenizer.vocab_size)
        ours = Ours(model_config, inputs.data, seq_len=config.seq_len, batch_size=config.batch_size)
        results = throughput.measure([ours], throughput.QUICK if quick else throughput.FULL, log=lambda line: None)
        measured[config.name] = (config.seq_len, config.batch_size, statistics.median(results["ours"].step_times))
        ours.close()
    return measured


@jax_entry_point("bench.data_pipeline: ")
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.data_pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller inputs, fewer batches")
    parser.add_argument("--workdir", default=inputs_lib.DEFAULT_WORKDIR, help="generated inputs and outputs go here")
    parser.add_argument("--chat-only", action="store_true", help="only the prepare throughput on JSONL chat rows")
    args = parser.parse_args(argv)
    workdir = pathlib.Path(args.workdir)
    if args.chat_only:
        (workdir / "data_pipeline").mkdir(parents=True, exist_ok=True)
        prepare_chat(workdir / "data_pipeline", PREPARE_CHAT_MB["quick" if args.quick else "full"])
        return 0
    inputs = inputs_lib.build_inputs(workdir)
    run(inputs, workdir / "data_pipeline", quick=args.quick, step_seconds=measure_step_seconds(inputs, quick=args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
