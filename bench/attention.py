"""Dense attention against the platform's kernel (flash on GPU, splash on TPU), forward and backward,
on the device it runs on: `python -m bench.attention --model gemma3-1b --seq-lens 1024 4096 8192`.

One layer's attention of the model (its heads, key/value heads and head size, bfloat16) over packed
rows of random documents, for a global layer and for a local (sliding-window) one: the median time of
the forward and backward passes over the repeats and the compiled program's memory (XLA's memory
analysis: arguments + outputs + temporaries). The dense path holds [B, heads, L, L] logits; the kernel
none, so the memory column shows what the kernel saves and the time column what it costs or gains.

`--dry-run` runs the same on the CPU with the tiny model at sequence 256, the flash kernel in
Pallas' interpreter (its times say nothing of a GPU's), to check the script.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from bench.stats import mib
from trainer.config import GEMMA3_MODELS, TINY
from trainer.gemma3.config import Attention
from trainer.gemma3.model import dense_attention
from trainer.model import models
from trainer.nn import layers
from trainer.run import hbm
from trainer.run.mesh import jax_entry_point

DRY_RUN_SEQ_LEN = 256
DOCUMENTS_PER_ROW = 4  # packed rows: the row cut at random into this many documents


def packed_rows(batch: int, seq_len: int, seed: int = 0) -> tuple[jax.Array, jax.Array]:
    """(segment_ids, positions) [batch, seq_len] of rows packed with random-length documents."""
    rng = np.random.default_rng(seed)
    segments = np.zeros((batch, seq_len), np.int32)
    positions = np.zeros((batch, seq_len), np.int32)
    for row in range(batch):
        cuts = [0, *sorted(rng.choice(np.arange(1, seq_len), DOCUMENTS_PER_ROW - 1, replace=False)), seq_len]
        for document, (start, end) in enumerate(zip(cuts, cuts[1:]), start=1):
            segments[row, start:end] = document
            positions[row, start:end] = np.arange(end - start)
    return jnp.asarray(segments), jnp.asarray(positions)


def attention_functions(kernel: str, *, interpret: bool, segments, positions, window: int | None, variants: dict) -> dict:
    """{"dense": f, name: f for each of the kernel's variants ({name: extra keyword arguments of its attend})},
    each (query, key, value) -> attended queries."""
    attend = layers.KERNELS[kernel].attend

    def variant(extra):
        return lambda q, k, v: attend(q, k, v, segments, window=window, interpret=interpret, **extra)

    return {"dense": lambda q, k, v: dense_attention(q, k, v, positions, segments, window=window),
            **{name: variant(extra) for name, extra in variants.items()}}


def kernel_variants(kernel: str, blocks: list[int], fused: str, seq_len: int) -> dict:
    """{name: extra keyword arguments}: splash once per tile size and backward (separate, fused or both) asked
    for, another kernel as it is."""
    if kernel != "splash":
        return {kernel: {}}
    choices = {"auto": (None,), "no": (False,), "yes": (True,), "both": (False, True)}[fused]
    sizes = [layers.splash_block_sizes(seq_len, block, fused_backward=f) for block in blocks for f in choices]
    return {f"splash {s.block_q}{' fused' if s.use_fused_bwd_kernel else ''}": {"block_sizes": s} for s in sizes}


def forward_and_backward(attend):
    """jit of (query, key, value, cotangent) -> gradients of sum(attend(q, k, v) * cotangent)."""
    def objective(query, key, value, cotangent):
        return jnp.sum(attend(query, key, value).astype(jnp.float32) * cotangent)
    return jax.jit(jax.grad(objective, argnums=(0, 1, 2)))


def measure(attend, arguments, repeats: int) -> tuple[float, int]:
    """(median seconds of one forward and backward pass after a warm-up, the compiled program's bytes)."""
    compiled = forward_and_backward(attend).lower(*arguments).compile()
    jax.block_until_ready(compiled(*arguments))
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*arguments))
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), hbm.needed_bytes(compiled)


def run(model_config, *, kernel: str, interpret: bool, seq_len: int, batch_size: int, repeats: int,
        blocks: list[int], fused: str) -> list[dict]:
    c = model_config
    segments, positions = packed_rows(batch_size, seq_len)
    keys = jax.random.split(jax.random.key(0), 4)
    query = jax.random.normal(keys[0], (batch_size, seq_len, c.num_heads, c.head_dim), jnp.bfloat16) * c.query_pre_attn_scalar**-0.5
    key, value = (jax.random.normal(k, (batch_size, seq_len, c.num_kv_heads, c.head_dim), jnp.bfloat16) for k in keys[1:3])
    cotangent = jax.random.normal(keys[3], query.shape, jnp.float32)
    variants = kernel_variants(kernel, blocks, fused, seq_len)
    rows = []
    for kind in sorted(set(c.attention_types), key=lambda kind: kind.value):
        window = c.sliding_window_size if kind is Attention.LOCAL else None
        functions = attention_functions(kernel, interpret=interpret, segments=segments, positions=positions, window=window,
                                        variants=variants)
        figures = {name: measure(attend, (query, key, value, cotangent), repeats) for name, attend in functions.items()}
        dense_s, dense_bytes = figures.pop("dense")
        for name, (kernel_s, kernel_bytes) in figures.items():
            print(f"  seq {seq_len:>6} {kind.value:<18} dense {dense_s * 1e3:9.2f} ms {mib(dense_bytes):>12}   "
                  f"{name:<16} {kernel_s * 1e3:9.2f} ms {mib(kernel_bytes):>12}   time {kernel_s / dense_s:5.2f}x  "
                  f"memory {kernel_bytes / dense_bytes:5.2f}x")
            rows.append({"seq_len": seq_len, "layer": kind.value, "dense_seconds": dense_s, "dense_bytes": dense_bytes,
                         "kernel": name, "kernel_seconds": kernel_s, "kernel_bytes": kernel_bytes})
    return rows


@jax_entry_point("bench.attention: ")
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.attention", description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(GEMMA3_MODELS), default="gemma3-1b")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--splash-blocks", type=int, nargs="+", default=[layers.SPLASH_BLOCK],
                        help=f"splash's tile sizes to compare (each halved until it divides the length; default {layers.SPLASH_BLOCK})")
    parser.add_argument("--fused-backward", choices=("auto", "no", "yes", "both"), default="auto",
                        help="splash's backward as one kernel (query and key/value gradients together), two, or both; "
                        "auto: the trainer's choice for the length")
    parser.add_argument("--json", type=pathlib.Path, help="also write the figures to this file, one object per layer kind and length")
    parser.add_argument("--dry-run", action="store_true", help=f"on the CPU: the tiny model at sequence {DRY_RUN_SEQ_LEN}, "
                        "the flash kernel in Pallas' interpreter")
    args = parser.parse_args(argv)
    platform = jax.default_backend()
    if args.dry_run:
        model_config, seq_lens, kernel, repeats = models.model_config(TINY, vocab_size=512), [DRY_RUN_SEQ_LEN], "flash", 1
    else:
        model_config, seq_lens, repeats = models.model_config(args.model, vocab_size=0), args.seq_lens, args.repeats
        kernels = {layers.choose_attention("auto", platform=platform, seq_len=seq_len) for seq_len in seq_lens}
        if kernels == {"dense"} or len(kernels) > 1:
            print(f"error: --seq-lens {' '.join(map(str, seq_lens))}: on {platform} the attention kernels are "
                  f"{', '.join(kernels)}; this benchmark needs a TPU or GPU and lengths its kernel's block divides, or --dry-run",
                  file=sys.stderr)
            return 2
        (kernel,) = kernels
    print(f"{args.model if not args.dry_run else TINY} on {jax.devices()[0].device_kind}, batch {args.batch_size}, "
          f"forward and backward of one layer's attention (median of {repeats})")
    rows = [row for seq_len in seq_lens for row in run(
        model_config, kernel=kernel, interpret=layers.interpreted(kernel, platform), seq_len=seq_len,
        batch_size=args.batch_size, repeats=repeats, blocks=args.splash_blocks, fused=args.fused_backward)]
    if args.json:
        args.json.write_text(json.dumps({"device": jax.devices()[0].device_kind, "batch_size": args.batch_size, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
