"""How the transformer's layers run in the train step: packed-document attention without a [B, L, L]
mask on TPU and GPU, and rematerialised blocks (trainer.gemma3.model reads these options).

The attention of packed rows runs through a Pallas kernel that takes the rows' segment ids and Gemma
3's causal sliding window, so that no [L, L] tensor exists: on TPU Pallas' splash attention kernel
(block-sparse masks), on NVIDIA GPUs our FlashAttention-2 kernels (trainer.nn.flash_attention). The
dense path (CPU, and lengths the kernel's blocks do not divide) builds the mask. Preconditions of the
kernels, held by the packed loader: positions restart at 0 in each document, and a row's length is a
multiple of the kernel's block (KERNELS).

Under FSDP each projection weight is gathered whole before its matmul (`gathered`), so that the TPU
partitioner writes one matmul, not a windowed loop over the weight's shards.

Rematerialisation (`--remat`): "none" keeps every activation for the backward pass; "dots" keeps
the projections' outputs of each block (PROJECTIONS) and the attention kernel's output, and recomputes
the rest; "full" keeps only each block's input and recomputes the block.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import NamedSharding, PartitionSpec

from trainer.errors import UserError
from trainer.nn import flash_attention
from trainer.nn.sharding import fsdp_spec

# The splash kernel's output and log-sum-exp carry this name: "dots" keeps them (a layer's output projection
# needs the attention's output in the backward pass, which "dots" alone would recompute with the kernel).
ATTENTION_RESIDUALS = "attention_residuals"

# A projection's output (with its LoRA adapter's added) and a LoRA adapter's rank-r intermediate carry this name:
# "dots" keeps them. Keeping every matmul's output instead (jax's dots_with_no_batch_dims_saveable) kept a LoRA
# projection's base and adapter outputs apart, two full-width tensors where their sum is one.
PROJECTIONS = "projections"

# Least recomputation first: --remat auto tries them in this order (trainer.run.step).
REMAT_POLICIES = {
    "none": None,
    "dots": jax.checkpoint_policies.save_only_these_names(ATTENTION_RESIDUALS, PROJECTIONS),
    "full": jax.checkpoint_policies.nothing_saveable,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerOptions:
    attention: str = "dense"  # or a name in KERNELS
    remat: str = "none"  # REMAT_POLICIES
    mesh: jax.sharding.Mesh | None = None  # the batch axes the kernel runs over, one shard per device
    batch_axes: tuple[str, ...] = ()
    interpret: bool = False  # the kernel in Pallas' interpreter (CPU tests)


def gathered(options: LayerOptions, weight, *, by_constraint: bool = False):
    """A projection's weight whole on every device of the run's mesh before its matmul: FSDP's gather,
    made explicit. Left to XLA's SPMD partitioner on TPU, a matmul of the token rows by an FSDP-split
    weight with a large output runs as a windowed loop over the weight's shards (windowed_dot_general):
    each iteration reads the whole input and writes a piece of the output, which is then copied into a
    zeroed [tokens, hidden] buffer (and the cost analysis counts the loop's body once). Gathered first
    (16 MB a feed-forward matrix at gemma3-1b), it is one matmul, which XLA fuses with the gated
    activation: at gemma3-1b, seq 8192, v6e 2x4, FSDP 8, remat dots, a layer's feed-forward moves 4.4 GB
    per chip and step instead of 12.5 GB (the loops' iterations counted), and the whole step (26 layers,
    global batch 16) 310 GB instead of 478 (which left the loops' iterations out), a roofline MFU bound
    of 60% instead of 38.7%, 23.3 GiB a chip instead of 26.8. The backward pass reduce-scatters the
    weight's gradient, as it did.

    The gather is an explicit all_gather in shard_map (its transpose is that reduce-scatter), not a
    sharding constraint: from a constraint, XLA gathered each parameter once and used the result in both
    the forward and the rematerialised backward, so every layer's whole weights stayed alive between the
    two (gemma3-12b full, v6e 2x4, 128 x 256, remat full: 44.3 GiB; explicit: 26.6 GiB, fits). A weight
    too small to split (trainer.nn.sharding.fsdp_spec) keeps the constraint, its placement only.

    `by_constraint` keeps the constraint for a split weight too: LoRA's factors, a few MB a layer whether
    XLA keeps them or not, which gathered explicitly cost a LoRA run more (gemma3-27b LoRA r16, v6e 2x4,
    128 x 256, remat full, 12 layers: 9.61 GiB of temporaries against 8.96, about 0.1 GiB a layer; the
    frozen base's gather made no difference either way)."""
    if options.mesh is None:
        return weight
    spec = fsdp_spec(tuple(weight.shape), options.mesh.shape["fsdp"])
    if by_constraint or "fsdp" not in spec:  # only its placement to state
        return jax.lax.with_sharding_constraint(weight, NamedSharding(options.mesh, PartitionSpec()))
    axis = list(spec).index("fsdp")
    gather = functools.partial(jax.lax.all_gather, axis_name="fsdp", axis=axis, tiled=True)
    # check_vma off: shard_map cannot infer that all_gather's result is the same on every device
    return jax.shard_map(gather, mesh=options.mesh, in_specs=spec, out_specs=PartitionSpec(), check_vma=False)(weight)


def choose_attention(requested: str, *, platform: str, seq_len: int) -> str:
    """"auto": the platform's kernel for rows its blocks divide, else dense. A kernel named for another
    accelerator than the run's is refused (on CPU it runs in the interpreter, for tests)."""
    if requested in KERNELS:
        kernel = KERNELS[requested]
        if platform not in (kernel.platform, "cpu"):
            raise UserError(f"--attention {requested}: the kernel runs on {kernel.platform}, this run is on {platform}; "
                            "use --attention auto")
        if seq_len % kernel.block:
            raise UserError(f"--attention {requested}: --seq-len {seq_len} must be a multiple of {kernel.block} (the kernel's block); "
                            "choose such a length or --attention auto")
    if requested != "auto":
        return requested
    native = [name for name, kernel in KERNELS.items() if kernel.platform == platform and seq_len % kernel.block == 0]
    return native[0] if native else "dense"


def interpreted(attention: str, platform: str) -> bool:
    """Whether the chosen attention kernel runs in Pallas' interpreter on `platform`."""
    return attention in KERNELS and KERNELS[attention].platform != platform


# Splash's tiles: the largest power of two up to this that divides the row, for every block of the forward and
# backward kernels, the backward as one kernel on short rows. Pallas' default (128 tiles, two backward kernels) left the
# kernel bound by its grid's steps: at gemma3-1b, 8 x 1024 on one v5e chip, attention took 68.8 ms of a 426 ms
# step (16%). One layer's forward and backward there (`python -m bench.attention --batch-size 8 --splash-blocks
# 128 256 512 1024 --fused-backward both`): 128 3.42 ms (global) / 2.85 (local), 512 fused 1.64 / 1.67, the
# fastest; 256 fused 1.69 / 1.69, 1024 fused 1.73 / 1.75.
SPLASH_BLOCK = 512
# The fused backward kernel writes a query gradient per key/value tile and sums them afterwards: at 1024 (two
# tiles) it is the faster one above, at 8192 (16 tiles) it added 12 GB of HBM traffic a chip to gemma3-1b's
# step on v6e 2x4, 8192 x 16, remat dots (the compiler's MFU bound 58.2% -> 56.1%). Longer rows keep two kernels.
FUSED_BACKWARD_MAX_TILES = 2


def splash_block_sizes(seq_len: int, largest: int = SPLASH_BLOCK, *, fused_backward: bool | None = None) -> splash.BlockSizes:
    """Tiles of `largest` (halved until it divides seq_len, a multiple of 128) for every kernel; with
    `fused_backward` (default: rows of at most FUSED_BACKWARD_MAX_TILES tiles) one backward kernel computes
    the query and key/value gradients together."""
    block = largest
    while seq_len % block:
        block //= 2
    if fused_backward is None:
        fused_backward = seq_len // block <= FUSED_BACKWARD_MAX_TILES
    backward_query = {} if fused_backward else {"block_q_dq": block, "block_kv_dq": block}
    return splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block, block_kv_dkv=block,
                             block_kv_dkv_compute=block, use_fused_bwd_kernel=fused_backward, **backward_query)


def _kernel(num_heads: int, seq_len: int, window: int | None, interpret: bool, block_sizes: splash.BlockSizes,
            causal: bool = True):
    """Built per trace (it holds arrays; a cached one would leak a tracer into the next trace)."""
    shape = (seq_len, seq_len)
    # Gemma's sliding window: a query at q sees keys at q - window < k <= q.
    mask = splash.CausalMask(shape) if window is None else splash.LocalMask(shape, window_size=(window - 1, 0), offset=0)
    if not causal:  # the image encoder's: every key
        mask = splash.FullMask(shape)
    return splash.make_splash_mha_single_device(splash.MultiHeadMask([mask] * num_heads), block_sizes=block_sizes,
                                                residual_checkpoint_name=ATTENTION_RESIDUALS, interpret=interpret)


def splash_attention(query, key, value, segment_ids, *, window: int | None, interpret: bool, block_sizes=None,
                     causal: bool = True):
    """query [B, L, N, H] (already scaled), key/value [B, L, K, H], segment_ids [B, L] -> [B, L, N, H];
    block_sizes: splash_block_sizes(L) unless given (bench.attention compares others)."""
    seq_len = query.shape[1]
    kernel = _kernel(query.shape[2], seq_len, window, interpret, block_sizes or splash_block_sizes(seq_len), causal)
    heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731

    def one_row(q, k, v, segments):
        return kernel(q, k, v, segment_ids=splash.SegmentIds(q=segments, kv=segments))

    return heads_first(jax.vmap(one_row)(heads_first(query), heads_first(key), heads_first(value), segment_ids))


@dataclasses.dataclass(frozen=True)
class Kernel:
    platform: str  # the jax platform it is compiled for; elsewhere it runs in Pallas' interpreter
    block: int  # a row's length must be a multiple of it
    attend: Callable  # (query, key, value, segment_ids, *, window, interpret) -> attended queries


KERNELS = {"splash": Kernel("tpu", 128, splash_attention), "flash": Kernel("gpu", flash_attention.BLOCK, flash_attention.flash_attention)}


def kernel_attention(options: LayerOptions, query, key, value, segment_ids, *, window: int | None, causal: bool = True):
    """options.attention's kernel over the run's mesh: a Pallas kernel is opaque to the partitioner,
    so each device runs it on its own rows. `causal` False (splash's alone) lets a query see every key."""
    attend = functools.partial(KERNELS[options.attention].attend, window=window, interpret=options.interpret,
                               **({} if causal else {"causal": False}))
    if options.mesh is not None:
        rows = PartitionSpec(options.batch_axes)
        attend = jax.shard_map(attend, mesh=options.mesh, in_specs=(rows, rows, rows, rows), out_specs=rows, check_vma=False)
    return attend(query, key, value, segment_ids)
