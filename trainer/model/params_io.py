"""Gemma parameter checkpoints read and written with Orbax alone.

The trainer image does not install the `gemma` package: it pulls in kauldron and TensorFlow (about
1.5 GB) for what is here a few dozen lines. This module reads and writes the checkpoints that
`gemma.gm.ckpts` (4.0.1) does, both ways (tests/trainer/model/test_params_io.py checks it against gemma):

- NESTED: the Flax `model.init()["params"]` tree as is; what `gm.ckpts.save_params` and
  `save_params` here write.
- FLAT: the layout of the official checkpoints: top-level keys such as
  "transformer/layer_0/attn/_key_norm" -> {"scale": ...}, an MLP weight under an extra "w"
  ("transformer/layer_0/mlp/linear" -> {"w": ...}), and the vision encoder under
  "SigLiPFromPatches_0/...".

Loading is text-only, like `gm.ckpts.load_params(path, text_only=True)`: when the checkpoint has a
vision encoder, it and the embedder's "mm_*" entries are not read at all (an Orbax partial restore).
The stacked (Gemma 3n) and Kauldron train-state layouts are not supported (ValueError).
Paths are local or gs://; Orbax reads gs:// through etils.epath, which needs gcsfs without TensorFlow.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp
from etils import epath

# The pre-trained Gemma 3 checkpoints by our model names (gm.ckpts.CheckpointPath.GEMMA3_*_PT).
OFFICIAL_CHECKPOINTS = {f"gemma3-{size}": f"gs://gemma-data/checkpoints/gemma3-{size}-pt" for size in ("270m", "1b", "4b", "12b", "27b")}

_TEXT, _VISION = "transformer", "SigLiPFromPatches_0"  # the FLAT layout's top-level prefixes
_VISION_ENCODER = "vision_encoder"  # the NESTED name of the vision encoder
_MM_EMBEDDER = ("mm_input_projection", "mm_soft_embedding_norm")  # the embedder's vision entries

Params = dict[str, Any]
KeyPath = tuple[str, ...]


def absolute_path(path) -> epath.Path:
    """Orbax wants absolute paths; a URL (gs://...) already is one."""
    return epath.Path(path if "://" in str(path) else os.path.abspath(path))


def _leaves(tree: dict, prefix: KeyPath = ()):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, (*prefix, key))
        else:
            yield (*prefix, key), value


def _put(tree: dict, path: KeyPath, value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _get(tree, path: KeyPath):
    for key in path:
        tree = tree[key]
    return tree


def _nested_path(path: KeyPath, flat: bool) -> KeyPath | None:
    """Where a checkpoint leaf goes in the NESTED tree, or None for an entry gemma drops too."""
    if not flat:
        return path
    top, *rest = path
    prefix, *parts = top.split("/")
    if "mlp/" in top:  # "transformer/layer_0/mlp/linear" -> {"w": x}: x is the weight itself
        if not rest or rest[0] != "w":
            return None
        rest = rest[1:]
    return (*([] if prefix == _TEXT else [_VISION_ENCODER]), *parts, *rest)


def _is_vision(path: KeyPath) -> bool:
    return path[0] == _VISION_ENCODER or (len(path) > 1 and path[0] == "embedder" and path[1] in _MM_EMBEDDER)


def load_params(path, *, sharding: Callable | jax.sharding.Sharding | None = None) -> Params:
    """The text-only NESTED params of the checkpoint at `path`, as jax arrays of its stored dtypes.

    `sharding`: None (each array on the first local device), one Sharding for every array, or a
    callable that takes the NESTED tree of jax.ShapeDtypeStruct and returns a matching tree of
    Shardings; each array is read straight into its sharding (each host reads only its shards).
    Raises FileNotFoundError when `path` holds no Orbax checkpoint, ValueError for a layout this
    module does not read.
    """
    path = absolute_path(path)
    checkpointer = ocp.PyTreeCheckpointer()
    metadata = checkpointer.metadata(path).item_metadata
    if metadata is None:
        raise FileNotFoundError(f"no Orbax checkpoint in {path}")
    stored = metadata.tree
    if not isinstance(stored, dict) or not stored:
        raise ValueError(f"{path}: not a Gemma parameter checkpoint")
    if any(key.startswith(f"{_TEXT}/stacked_layers") for key in stored) or set(stored) == {"collections", "opt_state", "params", "step"}:
        raise ValueError(f"{path}: a stacked or Kauldron Gemma checkpoint, which this trainer does not read")
    flat = all(key.startswith((f"{_TEXT}/", f"{_VISION}/")) for key in stored)

    places = {}  # checkpoint path -> NESTED path, for each leaf to read
    for stored_path, _ in _leaves(stored):
        nested = _nested_path(stored_path, flat)
        if nested is not None:
            places[stored_path] = nested
    if any(nested[0] == _VISION_ENCODER for nested in places.values()):  # as gemma: mm_* go with the encoder
        places = {key: nested for key, nested in places.items() if not _is_vision(nested)}

    abstract: Params = {}
    for stored_path, nested in places.items():
        leaf = _get(stored, stored_path)
        _put(abstract, nested, jax.ShapeDtypeStruct(leaf.shape, leaf.dtype))
    if sharding is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    shardings = sharding(abstract) if callable(sharding) else sharding

    target: Params = {}
    for stored_path, nested in places.items():
        leaf = _get(abstract, nested)
        where = shardings if isinstance(shardings, jax.sharding.Sharding) else _get(shardings, nested)
        _put(target, stored_path, jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=where))
    restored = checkpointer.restore(
        path,
        args=ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True
        ),
    )
    params: Params = {}
    for stored_path, nested in places.items():
        _put(params, nested, _get(restored, stored_path))
    return params


def save_params(params: Params, path) -> None:
    """Writes `params` (a NESTED tree) where `gm.ckpts.load_params(path)` and `load_params` read it,
    and returns once the write is complete. Every process of the job calls it (Orbax saves
    collectively; each process writes its shards)."""
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(absolute_path(path), params)
        checkpointer.wait_until_finished()
