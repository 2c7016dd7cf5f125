"""`python -m trainer.export --run WORKDIR --format hf --out DIR`: a run's model as a Hugging Face
directory that transformers, vLLM and other serving stacks load (Gemma3ForCausalLM, safetensors).

The weights are the run's newest: its latest checkpoint, else WORKDIR/export (what the run wrote at
its end). A LoRA run exports the merged model (`--lora-export merged`), the PEFT adapter alone
(`adapter`), or the frozen base it was trained on (`base`, for the adapter to sit on when the base is
not a published Gemma 3); a vision-language LoRA run's adapter saves its trained projector (and a trained
encoder) whole, as PEFT's modules_to_save, on a Gemma3ForConditionalGeneration base. The run's WORKDIR/config.json says which model, tokenizer and LoRA rank.

Weights are bfloat16 by default (as Google publishes Gemma 3 and the trainer computes on TPU);
`--dtype float32` keeps the float32 masters exactly.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shutil
import sys
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from safetensors.numpy import save_file

from trainer import contract, run_identity, shared_files
from trainer.config import GEMMA3_MODELS, TrainConfig
from trainer.data import tokenizer as tokenizer_lib
from trainer.errors import OneLineParser, UserError, entry_point, first_line
from trainer.gemma3.config import Gemma3Config
from trainer.hf import config as hf_config, processor as hf_processor, publish, tokenizer as hf_tokenizer, weights as hf_weights
from trainer.model import models
from trainer.run import checkpoint, mesh

FORMATS = ("hf",)
LORA_EXPORTS = ("merged", "adapter", "base")
DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
# transformers' default shard size ("5GB"): one file below it, shards and an index above.
MAX_SHARD_BYTES = 5 * 10**9
# The Hugging Face ids of the published pre-trained models, for an adapter's base_model_name_or_path.
HF_BASE_MODELS = {name: f"google/gemma-3-{name.removeprefix('gemma3-')}-pt" for name in GEMMA3_MODELS}


def host_array(x) -> np.ndarray:
    """The whole of a (possibly sharded, multi-host) array on this host; every process must call it."""
    if jax.process_count() > 1:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def _shards(sizes: dict[str, int], max_bytes: int) -> list[list[str]]:
    """Tensor names in order, cut into files of at most `max_bytes` (a larger tensor alone in one)."""
    shards, current, used = [], [], 0
    for name, size in sizes.items():
        if current and used + size > max_bytes:
            shards.append(current)
            current, used = [], 0
        current.append(name)
        used += size
    return [*shards, current]


def write_safetensors(directory: pathlib.Path, params, tensors: list[hf_weights.Tensor], *, dtype, stem: str,
                      max_shard_bytes: int = MAX_SHARD_BYTES, write: bool = True) -> None:
    """`stem`.safetensors, or `stem`-0000k-of-0000n.safetensors with `stem`.safetensors.index.json past
    `max_shard_bytes`. Tensors are gathered one shard at a time (every process takes part; only
    `write` ones write), so a host holds one shard, not the model."""
    by_name = {tensor.name: tensor for tensor in tensors}
    itemsize = np.dtype(dtype).itemsize
    sizes = {t.name: t.size(hf_weights.lookup(params, t.source).shape) * itemsize for t in tensors}
    shards = _shards(sizes, max_shard_bytes)
    files = [f"{stem}.safetensors"] if len(shards) == 1 else [
        f"{stem}-{k:05d}-of-{len(shards):05d}.safetensors" for k in range(1, len(shards) + 1)
    ]
    for file, names in zip(files, shards):
        arrays = {}
        for name in names:
            tensor = by_name[name]
            source = hf_weights.lookup(params, tensor.source)
            arrays[name] = np.ascontiguousarray(tensor.of(host_array(source.astype(jnp.dtype(dtype)))))
        if write:
            save_file(arrays, directory / file, metadata={"format": "pt"})
            os.chmod(directory / file, 0o644)  # safetensors writes 0600; a server may run as another user
    if write and len(shards) > 1:
        index = {"metadata": {"total_size": sum(sizes.values())},
                 "weight_map": {name: file for file, names in zip(files, shards) for name in names}}
        _write_json(directory / f"{stem}.safetensors.index.json", index)


def _write_json(path: pathlib.Path, value) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def write_model(directory: pathlib.Path, model_config, params, tokenizer, *, dtype: str,
                max_shard_bytes: int = MAX_SHARD_BYTES, write: bool = True, vision=None) -> None:
    """A Gemma3ForCausalLM directory of a plain (LoRA-free) gm tree, into the existing `directory`; with `vision`
    (the tree's image encoder) a Gemma3ForConditionalGeneration one, in Google's layout."""
    config = hf_config.model_config_json(model_config, dtype=dtype, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id,
                                         pad_id=tokenizer.pad_id)
    tensors = hf_weights.model_tensors(model_config)
    if vision is not None:
        config, tensors = hf_config.multimodal_config_json(config, vision), hf_weights.multimodal_tensors(model_config, vision)
    write_safetensors(directory, params, tensors, dtype=DTYPES[dtype], stem="model", max_shard_bytes=max_shard_bytes,
                      write=write)
    if write:
        _write_json(directory / "config.json", config)
        _write_json(directory / "generation_config.json", hf_tokenizer.generation_config_json(tokenizer))
        hf_tokenizer.write_tokenizer_files(tokenizer, directory, image_token_id=None if vision is None else vision.image_token_id)
        if vision is not None and hf_tokenizer.has_image_markers(tokenizer):
            hf_processor.write_processor_files(directory, vision)


def saved_modules(model_config, *, train_encoder: bool) -> list[str]:
    """What a LoRA run's adapter saves whole (PEFT's modules_to_save): a vision-language run's projector, trained
    beside the adapters, and its image encoder when that trained too (--vision-encoder trained)."""
    if model_config.vision is None:
        return []
    return ["multi_modal_projector", *(["vision_tower"] if train_encoder else [])]


def write_adapter(directory: pathlib.Path, model_config, trained, *, rank: int, base_model: str, dtype: str,
                  train_encoder: bool = False, write: bool = True) -> None:
    """A PEFT LoRA adapter directory of a LoRA run's trained tree (the adapters, trainer.model.models.adapters_only,
    and a vision-language run's projector), into the existing `directory`. On a vision-language model the adapter
    sits on Gemma3ForConditionalGeneration (its text layers under model.language_model.) and saves the trained
    projector (and encoder) whole, as PEFT's modules_to_save."""
    modules = saved_modules(model_config, train_encoder=train_encoder)
    text_model = hf_weights.TEXT_IN_MULTIMODAL if model_config.vision is not None else "model."
    tensors = hf_weights.lora_tensors(model_config.num_layers, text_model=text_model)
    if modules:
        tensors += hf_weights.saved_module_tensors(model_config.vision, modules)
    write_safetensors(directory, trained, tensors, dtype=DTYPES[dtype], stem="adapter_model", max_shard_bytes=sys.maxsize,
                      write=write)
    if not write:
        return
    _write_json(directory / "adapter_config.json", {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": rank,  # PEFT scales by lora_alpha / r; our LoRA (gemma's) does not scale
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": hf_weights.MULTIMODAL_TARGET_MODULES if modules else [*hf_weights.ATTENTION_MODULES,
                                                                                *hf_weights.MLP_MODULES],
        "fan_in_fan_out": False,
        "use_rslora": False,
        "inference_mode": True,
        **({"modules_to_save": modules} if modules else {}),
    })


def check_base_export(config: TrainConfig, model_config, *, what: str) -> None:
    """One line for a vision-language run's base at the end of training (--publish-parts base): the run keeps its
    frozen part only, without the projector the base had before training; trainer.export writes that base."""
    if model_config.vision is not None and "base" in config.publish_parts:
        raise UserError(f"{what} reads images, and its base's projector is not kept while it trains; leave base out "
                        f"and export it after the run: python -m trainer.export --run {config.workdir} --lora-export base")


def adapter_base_model(config: TrainConfig) -> str:
    """What an adapter's base_model_name_or_path says: the published model it trained on, else where its base is."""
    if config.weights == "official":
        return HF_BASE_MODELS[config.model]
    return f"the export of this run's base (--lora-export base): it trained on --weights {config.weights}"


@dataclasses.dataclass(frozen=True)
class Run:
    """What a run's WORKDIR/config.json says about its model."""

    workdir: pathlib.Path
    config: TrainConfig
    model_config: Gemma3Config
    tokenizer: tokenizer_lib.Tokenizer


def read_run(workdir: str, *, tokenizer: str | None = None) -> Run:
    config_file = pathlib.Path(workdir) / "config.json"
    try:
        recorded = json.loads(config_file.read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(f"--run {workdir}: no config.json there; pass the --workdir of a trainer run") from None
    except json.JSONDecodeError as error:
        raise UserError(f"--run {workdir}: {config_file} is not JSON ({error}); pass the --workdir of a trainer run") from None
    known = {field.name for field in dataclasses.fields(TrainConfig)}
    config = TrainConfig(**{key: value for key, value in recorded.items() if key in known})
    tokenizer_path = tokenizer or config.tokenizer
    if not tokenizer and not epath_exists(tokenizer_path):
        raise UserError(f"--run {workdir}: the run's tokenizer {tokenizer_path} (in {config_file}) is not there; "
                        "pass --tokenizer PATH to the same SentencePiece model")
    loaded = tokenizer_lib.load_tokenizer(tokenizer_path)
    images = bool((recorded.get("model_config") or {}).get("vision"))  # a vision-language run's
    return Run(pathlib.Path(workdir), config, models.model_config(config.model, vocab_size=loaded.vocab_size, images=images),
               loaded)


def epath_exists(path: str) -> bool:
    from etils import epath

    return epath.Path(path).exists()


def _on_one_device(tree):
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda _: device, tree)


def _latest_checkpoint_params(directory: str, abstract) -> tuple[int, dict] | None:
    """(step, trained params) of the newest checkpoint under `directory`, or None without one."""
    path = checkpoint.absolute_path(directory)
    if not path.exists():
        return None
    manager = ocp.CheckpointManager(path, item_names=("state", "data"), options=ocp.CheckpointManagerOptions(read_only=True))
    try:
        step = manager.latest_step()
        if step is None:
            return None
        target = {"params": jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=_on_one_device(s)), abstract)}
        restore = ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True
        )
        try:
            restored = manager.restore(step, args=ocp.args.Composite(state=restore))
        except (ValueError, KeyError, OSError) as error:
            raise UserError(f"--run: checkpoint step {step} in {directory} does not read ({type(error).__name__}: "
                            f"{first_line(error)}); move it aside to export an older one") from None
        return step, restored["state"]["params"]
    finally:
        manager.close()


def run_weights(run: Run) -> tuple[dict, dict | None, str]:
    """(trained, frozen, where from): as in trainer.run.step (models.trained_and_frozen): frozen is None for a
    text model's full fine-tune, else the LoRA base or the image encoder. The latest checkpoint first, else WORKDIR/export."""

    trained, frozen = models.initial_params(run.config, run.model_config, _on_one_device, resuming=True)
    found = _latest_checkpoint_params(run.config.resolved_checkpoint_dir, jax.eval_shape(lambda: trained))
    if found:
        step, trained = found
        return trained, frozen, f"the checkpoint of step {step} in {run.config.resolved_checkpoint_dir}"
    export_dir = run.workdir / "export" / ("lora" if run.config.lora_rank else "params")
    if not export_dir.exists():
        raise UserError(f"--run {run.workdir}: no checkpoint in {run.config.resolved_checkpoint_dir} and no {export_dir}; "
                        "train first, or point --run at the run's workdir")
    expected = jax.eval_shape(lambda: trained)
    return models.load_weights(str(export_dir), flag="--run", expected=expected, out_shardings=None), frozen, str(export_dir)


def export_run(run: Run, out: pathlib.Path, *, lora_export: str, dtype: str) -> str:
    """Writes `out` (which must not exist, or be empty); returns where the weights came from."""
    _require_free(out)
    if run.config.lora_rank and lora_export == "base":  # what the adapter sits on: the weights the run began from
        trained, source = None, f"its --weights {run.config.weights}"
        params = models.base_weights(run.config, run.model_config, _on_one_device)
    else:
        trained, frozen, source = run_weights(run)
        params = models.merge_lora_into_base(trained if frozen is None else models.join_lora(frozen, trained))
    with shared_files.replaced_atomically(out) as temporary:
        temporary.mkdir()
        if run.config.lora_rank and lora_export == "adapter":
            write_adapter(temporary, run.model_config, trained, rank=run.config.lora_rank,
                          base_model=adapter_base_model(run.config), dtype=dtype,
                          train_encoder=run.config.vision_encoder == "trained")
        else:
            write_model(temporary, run.model_config, params, run.tokenizer, dtype=dtype, vision=run.model_config.vision)
        if out.exists():
            out.rmdir()  # empty (checked above): os.replace needs the name free on every filesystem
    return source


def write_final_export(directory: pathlib.Path, write: Callable[[pathlib.Path, bool], None]) -> None:
    """WORKDIR/export/<part> at the end of a run, replacing an earlier export: `write(folder, is_main)`
    fills the folder (every process gathers, process 0 writes), under a temporary name that process 0
    then renames."""
    is_main = jax.process_index() == 0
    temporary = shared_files.temporary_sibling(directory)
    try:
        if is_main:
            temporary.mkdir(parents=True)
        write(temporary, is_main)
        if is_main:  # replacing the run's own earlier export, e.g. before it was resumed for more steps
            shared_files.replace_directory(directory, temporary)
    finally:
        if is_main and temporary.exists():
            shutil.rmtree(temporary)


def _require_free(out: pathlib.Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out}: exists and is not empty; choose a new directory (nothing there is replaced)")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m trainer.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="the run's --workdir (with its config.json)")
    parser.add_argument("--format", choices=FORMATS, default="hf", help="hf: a Hugging Face model directory (default)")
    parser.add_argument("--out", required=True, help="the directory to write (new, or empty)")
    parser.add_argument("--lora-export", choices=LORA_EXPORTS, default="merged",
                        help="a LoRA run: merged (the adapted model), adapter (PEFT adapter alone), base (the frozen base)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16", help="the weights' dtype (default bfloat16)")
    parser.add_argument("--tokenizer", help="the run's SentencePiece model, where config.json's path does not reach it")
    parser.add_argument("--publish", metavar="PUBLISH_DIR", help="then publish the merged model at --out as a new version "
                        "there, the one serving follows (trainer.hf.publish)")
    return parser.parse_args(argv)


@entry_point("trainer.export: ")
def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    mesh.require_requested_platform()
    _require_free(pathlib.Path(args.out))
    if args.publish is not None:
        publish.check_publish_dir(args.publish, flag="--publish")
    if args.publish and args.lora_export != "merged":
        raise UserError(f"--publish with --lora-export {args.lora_export}: a version serves the base and its adapter together; "
                        "export both, then python -m trainer.hf.publish --part base --part adapter")
    run = read_run(args.run, tokenizer=args.tokenizer)
    if args.lora_export != "merged" and not run.config.lora_rank:
        raise UserError(f"--lora-export {args.lora_export}: the run at {args.run} is a full fine-tune (no LoRA); leave it out")
    source = export_run(run, pathlib.Path(args.out), lora_export=args.lora_export, dtype=args.dtype)
    print(f"trainer.export: wrote {args.out} from {source}")
    if args.publish is not None:
        version = publish.publish(args.publish, run_identity.identity(run.workdir), {contract.PUBLISHED_MODEL_DIR: pathlib.Path(args.out)})
        print(f"trainer.export: published {version}")


if __name__ == "__main__":
    sys.exit(main())
