"""How gemma's layers run in the train step: packed-document attention without a [B, L, L] mask on TPU,
and rematerialised blocks.

gemma's `Attention` takes a dense [B, L, L] mask and materialises the [B, heads, L, L] logits with it.
On TPU the attention of packed rows runs instead through Pallas' splash attention kernel, which takes
the rows' segment ids and Gemma 3's causal sliding window as block-sparse masks, so that no [L, L]
tensor exists. Both changes go in through `flax.linen.intercept_methods` around gemma's own modules:
its parameters, LoRA wrappers and checkpoints stay as they are, and the interceptor calls the
module's own projections, norms and rotary embedding (gemma 4.0.1's `Attention.__call__`; the CPU
test of trainer.layers against the dense path guards an upgrade). Preconditions of the kernel, held
by the packed loader: positions restart at 0 in each document, and a row's length is a multiple of
128 (the kernel's block).

Rematerialisation (`--remat`): "none" keeps every activation for the backward pass; "dots" keeps
the matmul outputs of each block and recomputes the rest; "full" keeps only each block's input and
recomputes the block.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading

import flax.linen as nn
import jax
import jax.numpy as jnp
from gemma.gm.math import _positional_embeddings
from gemma.gm.nn import _modules
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec

from trainer.errors import UserError

# Least recomputation first: --remat auto tries them in this order (trainer.step).
REMAT_POLICIES = {
    "none": None,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "full": jax.checkpoint_policies.nothing_saveable,
}
SPLASH_BLOCK = 128  # the kernel's block: a row's length must be a multiple of it
# What the interceptor reads reaches it as a variable collection, not a closure: gemma's Transformer is
# an nn.jit, whose trace cache sees the variables' structure but neither closures nor interceptors.
PACKING = "packing"


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerOptions:
    attention: str = "dense"  # or "splash"
    remat: str = "none"  # REMAT_POLICIES
    mesh: jax.sharding.Mesh | None = None  # the batch axes the kernel runs over, one shard per device
    batch_axes: tuple[str, ...] = ()
    interpret: bool = False  # the kernel in Pallas' interpreter (CPU tests)

    @property
    def stock(self) -> bool:
        """gemma's own modules, untouched: nothing to intercept and nothing to pass."""
        return self.attention == "dense" and self.remat == "none"


def choose_attention(requested: str, *, platform: str, seq_len: int) -> str:
    """"auto": splash on TPU for rows the kernel's blocks divide, else dense."""
    if requested == "splash" and seq_len % SPLASH_BLOCK:
        raise UserError(f"--attention splash: --seq-len {seq_len} must be a multiple of {SPLASH_BLOCK} (the kernel's block); "
                        "choose such a length or --attention auto")
    if requested != "auto":
        return requested
    return "splash" if platform == "tpu" and seq_len % SPLASH_BLOCK == 0 else "dense"


def _kernel(num_heads: int, seq_len: int, window: int | None, softcap: float | None, interpret: bool):
    """Built per trace (it holds arrays; a cached one would leak a tracer into the next trace)."""
    shape = (seq_len, seq_len)
    # Gemma's sliding window: a query at q sees keys at q - window < k <= q.
    mask = splash.CausalMask(shape) if window is None else splash.LocalMask(shape, window_size=(window - 1, 0), offset=0)
    return splash.make_splash_mha_single_device(splash.MultiHeadMask([mask] * num_heads), attn_logits_soft_cap=softcap,
                                                interpret=interpret)


def splash_attention(query, key, value, segment_ids, *, window: int | None, softcap: float | None, interpret: bool):
    """query [B, L, N, H] (already scaled), key/value [B, L, K, H], segment_ids [B, L] -> [B, L, N, H]."""
    kernel = _kernel(query.shape[2], query.shape[1], window, softcap, interpret)
    heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731

    def one_row(q, k, v, segments):
        return kernel(q, k, v, segment_ids=splash.SegmentIds(q=segments, kv=segments))

    return heads_first(jax.vmap(one_row)(heads_first(query), heads_first(key), heads_first(value), segment_ids))


def _packed_attention(options: LayerOptions, module: _modules.Attention, x, positions, segment_ids):
    """gemma's Attention.__call__ without a cache, its logits and softmax replaced by the kernel."""
    query = module.q_einsum("BTD,NDH->BTNH", x)
    key, value = module.kv_einsum("BSD,CKDH->CBSKH", x)
    if module.use_qk_norm:
        query, key = module._query_norm(query), module._key_norm(key)
    rope = functools.partial(_positional_embeddings.apply_rope, positions=positions,
                             base_frequency=module.rope_base_frequency, scale_factor=module.rope_scale_factor)
    query, key = rope(query) * module.query_pre_attn_scalar, rope(key)
    local = module.attn_type == _modules.AttentionType.LOCAL_SLIDING
    attend = functools.partial(splash_attention, window=module.sliding_window_size if local else None,
                               softcap=module.attn_logits_soft_cap, interpret=options.interpret)
    if options.mesh is not None:
        # A Pallas kernel is opaque to the partitioner: each device runs it on its own rows.
        rows = PartitionSpec(options.batch_axes)
        attend = jax.shard_map(attend, mesh=options.mesh, in_specs=(rows, rows, rows, rows), out_specs=rows, check_vma=False)
    return module.attn_vec_einsum("BTNH,NHD->BTD", attend(query, key, value, segment_ids))


_state = threading.local()  # set while a rematerialised block runs its own __call__


def _interceptor(options: LayerOptions):
    def intercept(next_fun, args, kwargs, context):
        module = context.module
        if context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        if options.attention == "splash" and isinstance(module, _modules.Attention):
            x, positions, cache, _ = args
            if cache is None and not module.use_qkv_einsum:
                return None, _packed_attention(options, module, x, positions, _segment_ids(module))
        if REMAT_POLICIES[options.remat] and isinstance(module, _modules.Block) and not getattr(_state, "inside", False):
            segment_ids = module.scope.root.get_variable(PACKING, "segment_ids")
            return nn.checkpoint(_own_call, policy=REMAT_POLICIES[options.remat])(module, segment_ids, *args, **kwargs)
        return next_fun(*args, **kwargs)

    return intercept


def _segment_ids(module):
    """The rows' segment ids: an argument of the rematerialised block around `module`, if there is one
    (a lifted scope sees only its own module's variables), else the model's packing collection."""
    inside = getattr(_state, "segment_ids", None)
    return inside if inside is not None else module.scope.root.get_variable(PACKING, "segment_ids")


def _own_call(module, segment_ids, *args):
    _state.inside, _state.segment_ids = True, segment_ids
    try:
        return module(*args)
    finally:
        _state.inside, _state.segment_ids = False, None


def variables(options: LayerOptions, segment_ids) -> dict:
    """The collections `model.apply` takes beside the params: the segment ids for the kernel, and a
    marker named after the options, so that gemma's nn.jit traces each set of options apart."""
    if options.stock:
        return {}
    packing = {f"options-{options.attention}-{options.remat}": jnp.zeros((0,), jnp.int8)}
    if options.attention == "splash":
        packing["segment_ids"] = segment_ids
    return {PACKING: packing}


@contextlib.contextmanager
def applied(options: LayerOptions):
    """Within it, gemma's modules run as `options` says."""
    if options.stock:
        yield
        return
    with nn.intercept_methods(_interceptor(options)):
        yield
