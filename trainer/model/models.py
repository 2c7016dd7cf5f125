"""Gemma 3 models (trainer.gemma3), a tiny one for CPU, their weights, and LoRA.

Parameters are float32 masters (the optimizer updates these); `trainer.nn.loss` casts them to the
compute dtype for the forward pass: AdamW's small updates would vanish when added to bfloat16 weights.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from trainer.config import GEMMA3_MODELS, TINY, TrainConfig
from trainer.data import images
from trainer.errors import UserError
from trainer.gemma3 import config as gemma3_config
from trainer.gemma3.config import Gemma3Config, VisionConfig
from trainer.gemma3.model import LORA, Transformer
from trainer.hf import load as hf_load
from trainer.model import params_io
from trainer.storage import check_reachable, reading

Params = dict[str, Any]
# What a --weights or --lora-weights path that cannot be read may be replaced with.
_LOCAL_COPY = "copy the directory to a local disk and pass that"


def model_config(name: str, *, vocab_size: int, images: bool = False) -> Gemma3Config:
    """The architecture of a model; `vocab_size` (the tokenizer's) sizes only `tiny`. With `images`, the
    vision-language model (vision_config), else the text model alone."""
    text = gemma3_config.tiny(vocab_size) if name == TINY else GEMMA3_MODELS[name]
    return dataclasses.replace(text, vision=vision_config(name, vocab_size=vocab_size)) if images else text


def vision_config(name: str, *, vocab_size: int) -> VisionConfig | None:
    """The image encoder a model reads images with: SigLIP for gemma3-4b and larger, the tiny one for `tiny`
    (its image token just past the tokenizer's pieces); None for the text-only 270m and 1b."""
    if name == TINY:
        return gemma3_config.tiny_vision(image_token_id=vocab_size)
    return gemma3_config.SIGLIP if name in VISION_MODELS else None


def image_layout(name: str, *, vocab_size: int) -> images.Layout | None:
    """How a model's data holds images (None: the model reads none)."""
    vision = vision_config(name, vocab_size=vocab_size)
    return vision and images.Layout(size=vision.image_size, token_id=vision.image_token_id, soft_tokens=vision.soft_tokens)


# What a vision-language run trains by default (issue 53): the language model (whole or its LoRA adapters) and
# the projector; the image encoder stays as loaded.
VISION_MODELS = ("gemma3-4b", "gemma3-12b", "gemma3-27b")
_ENCODER = (("vision_encoder",),)
_PROJECTOR = (("embedder", "mm_soft_embedding_norm"), ("embedder", "mm_input_projection"))
# The branches of PEFT's modules_to_save (trainer.hf.weights.SAVED_MODULES).
_SAVED_MODULES = {"multi_modal_projector": _PROJECTOR, "vision_tower": _ENCODER}


def _apart(params: Params, paths) -> tuple[Params, Params]:
    """(params without the branches at `paths`, those branches nested as in params); every path exists."""
    rest, taken = dict(params), {}
    for path in paths:
        source, target = rest, taken
        for key in path[:-1]:
            source[key] = dict(source[key])
            source, target = source[key], target.setdefault(key, {})
        target[path[-1]] = source.pop(path[-1])
    return rest, taken


def trained_and_frozen(base: Params, adapters: Params | None = None, *,
                       train_encoder: bool = False) -> tuple[Params, Params | None]:
    """The run's (trained, frozen) of its model's weights `base`: a full fine-tune (no `adapters`) trains them
    all, but a vision-language model's image encoder; LoRA trains the adapters, and a vision-language model's
    projector beside them. `train_encoder` (--vision-encoder trained): the image encoder trains too, whole.
    step.model_params joins them back."""
    vision = "vision_encoder" in base
    if not vision:
        return (base, None) if adapters is None else (adapters, base)
    if adapters is None:
        return (base, None) if train_encoder else _apart(base, _ENCODER)
    frozen, taken = _apart(base, _PROJECTOR + _ENCODER if train_encoder else _PROJECTOR)
    return join_lora(taken, adapters), frozen


def check_vocabulary(name: str, config: Gemma3Config, *, tokenizer_path: str, vocab_size: int) -> None:
    if vocab_size > config.num_embed:
        raise UserError(
            f"--tokenizer {tokenizer_path}: its vocabulary ({vocab_size} pieces) does not fit --model {name} "
            f"({config.num_embed} embeddings); use the model's own tokenizer"
        )


def official_checkpoint(name: str) -> str:
    if name == TINY:
        raise UserError("--model tiny has no official weights: use --weights random or a checkpoint path")
    return params_io.OFFICIAL_CHECKPOINTS[name]


def build_model(config: Gemma3Config, *, dtype, lora_rank: int = 0) -> Transformer:
    """The flax module; `dtype` is the dtype its parameters (and hence its computation) have; with
    `config.vision`, a vision-language model."""
    return Transformer(config=config, dtype=dtype, lora_rank=lora_rank)


def _dummy_inputs(vision: VisionConfig | None) -> tuple[jax.Array, ...]:
    """What the model is initialised on: tokens, and one image a row for a vision-language model."""
    tokens = jnp.ones((1, 8), jnp.int32)
    if vision is None:
        return (tokens,)
    return tokens, None, None, jnp.zeros((1, 1, vision.image_size, vision.image_size, 3), jnp.float32)


# Initialisation is compiled and run once a run. On CPU, LLVM's optimisation of its random-number code was
# most of that compile (the tiny model's init 4.9 s, 0.9 s unoptimised; a six-layer LoRA model's 40 s, 4 s
# unoptimised), so it is skipped there: a seed gives the same weights every run (not bit-equal to an optimised
# compile's, which differed in the last bits).
INIT_COMPILER_OPTIONS = {"cpu": {"xla_backend_optimization_level": 0}}


def _initialised(init: Callable, seed: int, out_shardings: Callable | None, shapes: Params) -> Params:
    key = jax.random.key(seed)
    shardings = out_shardings(shapes) if out_shardings else None
    traced = isinstance(key, jax.core.Tracer)  # inside jax.eval_shape (shapes only): nothing is compiled
    options = None if traced else INIT_COMPILER_OPTIONS.get(jax.default_backend())
    return jax.jit(init, out_shardings=shardings, compiler_options=options)(key)


def _base_init(config, lora_rank: int) -> Callable:
    model = build_model(config, dtype=jnp.float32, lora_rank=lora_rank)

    def init(key):  # named: the compilation cache's line names the programs it compiled
        return model.init(key, *_dummy_inputs(config.vision))["params"]

    return init


def _adapters_init(config, lora_rank: int) -> Callable:
    model = build_model(dataclasses.replace(config, vision=None), dtype=jnp.float32, lora_rank=lora_rank)

    def init(key):
        return adapters_only(model.init(key, *_dummy_inputs(None))["params"])  # the base weights are dead code here

    return init


@functools.lru_cache(maxsize=16)
def _traced_shapes(make_init: Callable, config, lora_rank: int) -> Params:
    init = make_init(config, lora_rank)
    return jax.eval_shape(lambda: init(jax.random.key(0)))  # the key traced too: nothing runs


def param_shapes(config, *, lora_rank: int = 0) -> Params:
    """What init_params gives (any seed), as shapes and dtypes, traced once a process for a model: a start needs
    them several times (the state's shardings, a checkpoint's restore target, the initial weights' shardings, a
    checkpoint's check), and tracing gemma3-270m's or 1b's initialisation takes about half a second each time.
    A new tree each call (the cached one is never handed out)."""
    return jax.tree.map(lambda leaf: leaf, _traced_shapes(_base_init, config, lora_rank))


def adapter_shapes(config, *, lora_rank: int) -> Params:
    """What init_adapters gives, as shapes and dtypes, traced once a process (param_shapes)."""
    return jax.tree.map(lambda leaf: leaf, _traced_shapes(_adapters_init, config, lora_rank))


def with_shardings(shapes: Params, shard: Callable) -> Params:
    """`shapes` with the shardings `shard(shapes)` gives them: what jax.eval_shape of a jit with those out_shardings says."""
    return jax.tree.map(lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
                        shapes, shard(shapes))


def init_params(config, *, seed: int, lora_rank: int = 0, out_shardings: Callable | None = None) -> Params:
    """Random float32 parameters (base + adapters when lora_rank; the image encoder and projector with
    `config.vision`), created already sharded."""
    return _initialised(_base_init(config, lora_rank), seed, out_shardings, param_shapes(config, lora_rank=lora_rank))


def init_adapters(config, *, seed: int, lora_rank: int, out_shardings: Callable | None = None) -> Params:
    """Only the LoRA adapter weights (B = 0, so the model starts as the base model)."""
    return _initialised(_adapters_init(config, lora_rank), seed, out_shardings, adapter_shapes(config, lora_rank=lora_rank))


def adapters_only(params: Params) -> Params:
    """The branches of `params` that lead to LoRA factors, nested as in `params`."""
    kept = {}
    for key, value in params.items():
        if key == LORA:
            kept[key] = value
        elif isinstance(value, dict) and (branch := adapters_only(value)):
            kept[key] = branch
    return kept


def load_weights(path: str, *, flag: str, expected, out_shardings: Callable | None) -> Params:
    """A Gemma parameter checkpoint (trainer.model.params_io) as float32 masters, sharded by `out_shardings(tree)`.

    `expected` (ShapeDtypeStructs of the model's params) catches a checkpoint of another model or
    vocabulary before training starts.
    """
    try:
        params = params_io.load_params(path, sharding=out_shardings)
    except FileNotFoundError:
        raise UserError(f"{flag} {path}: no checkpoint there (expected Gemma parameters, as gm.ckpts.save_params "
                        "and `python -m trainer` exports write them)") from None
    describe = lambda tree: {jax.tree_util.keystr(k): tuple(v.shape) for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}  # noqa: E731
    got, want = describe(params), describe(expected)
    if got != want:
        key = next(k for k in sorted(set(got) | set(want)) if got.get(k) != want.get(k))
        raise UserError(
            f"{flag} {path}: does not fit the model: {key} is {got.get(key, 'missing')} in the checkpoint, the model "
            f"needs {want.get(key, 'none')} (another --model, or a tokenizer with another vocabulary size?)"
        )
    return jax.jit(lambda tree: jax.tree.map(lambda x: x.astype(jnp.float32), tree), donate_argnums=0)(params)


def join_lora(base: Params, adapters: Params) -> Params:
    """One tree of the base weights and the adapters' branches (the inverse of splitting them)."""
    joined = dict(base)
    for key, value in adapters.items():
        joined[key] = join_lora(base[key], value) if key in base else value
    return joined


def merge_lora_into_base(params: Params) -> Params:
    """Folds each adapter into the weight it adapts: W + A @ B, giving a plain (LoRA-free) Gemma tree.

    The adapter's A holds the weight's input (and batch) axes, B its
    output axes, each in the weight's own order, so the weight's axes are recovered from the shapes.
    """
    merged = {}
    for key, value in params.items():
        if key.startswith("_LoRAEinsum_"):
            continue
        if isinstance(value, dict):
            merged[key] = merge_lora_into_base(value)
        else:
            adapter = params.get("_LoRAEinsum_0" if key == "w" else f"_LoRAEinsum_{key}")
            merged[key] = value + _adapter_delta(value.shape, adapter["lora"]) if adapter else value
    return merged


def _adapter_delta(weight_shape: tuple[int, ...], lora: Params) -> jax.Array:
    a, b = lora["a"], lora["b"]
    a_sizes, b_sizes = a.shape[:-1], b.shape[1:]
    letters = "abcdefghijklmnopqrstuvwxy"[: len(weight_shape)]
    layouts = set()
    for a_axes in itertools.combinations(range(len(weight_shape)), len(a_sizes)):
        b_axes = tuple(i for i in range(len(weight_shape)) if i not in a_axes)
        if tuple(weight_shape[i] for i in a_axes) == a_sizes and tuple(weight_shape[i] for i in b_axes) == b_sizes:
            layouts.add((a_axes, b_axes))
    if len(layouts) != 1:
        raise ValueError(f"cannot tell how a LoRA adapter {a.shape} x {b.shape} maps onto a weight {weight_shape}")
    ((a_axes, b_axes),) = layouts
    a_str = "".join(letters[i] for i in a_axes) + "z"
    b_str = "z" + "".join(letters[i] for i in b_axes)
    return jnp.einsum(f"{a_str},{b_str}->{letters}", a, b)


def initial_params(config: TrainConfig, model_config, shard, *, resuming: bool):
    """(trained, frozen): full fine-tune -> (all weights, None); LoRA -> (adapters, base weights).

    A vision-language model's image encoder is frozen in a full fine-tune too, and its projector trained with
    LoRA (trained_and_frozen). A resumed text model's full fine-tune restores every weight from the checkpoint,
    so only the shapes are built here; a resumed LoRA run (or vision-language one) still needs its frozen part.
    """
    train_encoder = config.vision_encoder == "trained"
    if not config.lora_rank:
        if resuming and (model_config.vision is None or train_encoder):
            return with_shardings(param_shapes(model_config), shard), None
        return trained_and_frozen(base_weights(config, model_config, shard), train_encoder=train_encoder)
    base = base_weights(config, model_config, shard)
    fresh = lambda: init_adapters(model_config, seed=config.seed + 1, lora_rank=config.lora_rank, out_shardings=shard)  # noqa: E731
    if config.lora_weights and not resuming:  # a resumed run's adapters are its checkpoint's
        expected = with_shardings(adapter_shapes(model_config, lora_rank=config.lora_rank), shard)
        with reading("--lora-weights", config.lora_weights, instead=_LOCAL_COPY):
            adapter = hf_load.AdapterDirectory(config.lora_weights)
            adapters = adapter.load(model_config, expected, shard(expected))
            base = _with_saved_modules(base, adapter, model_config, shard)
    else:
        adapters = fresh()
    return trained_and_frozen(base, adapters, train_encoder=train_encoder)


def _weights_path(config: TrainConfig) -> str:
    return official_checkpoint(config.model) if config.weights == "official" else config.weights


def _with_saved_modules(base: Params, adapter, model_config, shard) -> Params:
    """`base` with the modules the adapter saves whole (a vision-language run's projector, and encoder) over its own."""
    paths = tuple(path for module in adapter.saved_modules for path in _SAVED_MODULES[module])
    if not paths:
        return base
    rest, replaced = _apart(base, paths)
    expected = jax.eval_shape(lambda: replaced)
    return join_lora(rest, adapter.load_saved_modules(model_config, expected, shard(expected)))


def base_weights(config: TrainConfig, model_config, shard):
    """The model's weights as --weights gives them: random, the official checkpoint, a checkpoint path or
    a Hugging Face directory."""
    if config.weights == "random":
        return init_params(model_config, seed=config.seed, out_shardings=shard)
    path = _weights_path(config)
    expected = param_shapes(model_config)
    with reading("--weights", path, instead=_LOCAL_COPY):
        if config.weights != "official" and hf_load.is_model_directory(path):
            return hf_load.ModelDirectory(path).load(model_config, expected, shard(expected), vision=model_config.vision)
        return load_weights(path, flag="--weights", expected=expected, out_shardings=shard)


def check_weights(config, model_config, *, tokenizer: str | None = None, vocab_size: int | None = None) -> None:
    """The run's --weights and --lora-weights (if it has them) against its model and tokenizer, before any
    weight is read or step compiled: a Hugging Face directory from its configs and headers; a gs:// path
    the run cannot read (credentials, network) is one line here rather than a traceback later."""
    if config.weights != "random":
        path = _weights_path(config)
        with reading("--weights", path, instead=_LOCAL_COPY):
            if config.weights != "official" and hf_load.is_model_directory(path):
                expected = param_shapes(model_config)
                hf_load.ModelDirectory(path).check(config.model, model_config, expected, tokenizer=tokenizer,
                                                   vocab_size=vocab_size, vision=model_config.vision)
            else:
                check_reachable("--weights", path, instead=_LOCAL_COPY)
    if config.lora_weights:
        expected = adapter_shapes(model_config, lora_rank=config.lora_rank)
        with reading("--lora-weights", config.lora_weights, instead=_LOCAL_COPY):
            hf_load.AdapterDirectory(config.lora_weights).check(
                model_config, expected, lora_rank=config.lora_rank,
                model_expected=param_shapes(model_config))
