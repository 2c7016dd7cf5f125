"""What a run writes beside its checkpoints: the resolved config.json, the final export and its published version."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

import jax
import jax.numpy as jnp

from trainer import export, run_identity, shared_files
from trainer.config import TrainConfig
from trainer.errors import UserError
from trainer.hf import publish
from trainer.loop.inputs import Inputs
from trainer.model import models
from trainer.run import checkpoint, hbm, step


def write_resolved_config(config: TrainConfig, workdir: pathlib.Path, *, model_config, inputs: Inputs, total_steps: int,
                          mesh_shape: dict, compute_dtype, run_step: step.RunStep, step_fingerprint: str,
                          footprint: hbm.BeforeFirstStep | None = None) -> None:
    resolved = {
        **dataclasses.asdict(config),
        "data": inputs.data_source,
        # What the data is, as prepared (the options above are what was asked for).
        "data_format": inputs.data.data_format,
        "loss_on": inputs.data.loss_on,
        "skipped_rows": inputs.data.skipped_rows,
        "tokenizer": inputs.tokenizer_path,
        "checkpoint_dir": config.resolved_checkpoint_dir,
        "tensorboard_dir": config.resolved_tensorboard_dir,
        "total_steps": total_steps,
        "mesh": mesh_shape,
        "process_count": jax.process_count(),
        "device_kind": jax.devices()[0].device_kind,
        "compute_dtype": jnp.dtype(compute_dtype).name,
        "attention_kind": run_step.layers.attention,  # what --attention auto and --remat auto became
        "remat_policy": run_step.layers.remat,
        "remat_speeds": [dataclasses.asdict(speed) for speed in run_step.remat_speeds],  # what --remat auto compared
        "vocab_chunk": run_step.vocab_chunk,  # what --vocab-chunk became (null: plain logits)
        # The lowered train step's digest: `python -m workloads fit` reports the same for the program it compiled.
        "step_fingerprint": step_fingerprint,
        # Bytes on the fullest device before step 1 and what the step adds (trainer.run.hbm); null on the CPU.
        "device_memory": footprint and footprint.figures(),
        "model_config": dataclasses.asdict(model_config),
    }
    shared_files.write_text_atomically(workdir / "config.json", json.dumps(resolved, indent=2, default=str) + "\n")


def export_final(workdir: pathlib.Path, state, frozen, *, config: TrainConfig, model_config, tokenizer) -> None:
    """WORKDIR/export/params: a plain Gemma tree (trainer.model.params_io; gemma's gm.ckpts.load_params reads it too) (LoRA merged in);
    with LoRA also WORKDIR/export/lora, the adapters alone; and WORKDIR/export/hf, the same model as a
    Hugging Face directory (bfloat16) that serving stacks load, with WORKDIR/export/base and adapter
    when --publish-parts asks for them. They are published as a new version to --publish-dir when
    given (process 0; trainer.hf.publish), unless a version of this run at this step already holds
    them (a relaunch of a finished run trains nothing and publishes nothing). A failed HF export or
    publication only warns: the weights are safe in export/params, and `python -m trainer.export`
    writes it again."""
    export_dir = workdir / "export"
    if config.lora_rank:
        checkpoint.export_params(state["params"], export_dir / "lora")
    base = jax.tree.map(lambda p: p.astype(jnp.float32), frozen)
    merged = models.merge_lora_into_base(step.model_params(state["params"], base))
    checkpoint.export_params(merged, export_dir / "params")
    writers = {
        "hf": lambda folder, write: export.write_model(folder, model_config, merged, tokenizer, dtype="bfloat16", write=write,
                                                       vision=model_config.vision),
        "base": lambda folder, write: export.write_model(folder, model_config, frozen, tokenizer, dtype="bfloat16", write=write),
        "adapter": lambda folder, write: export.write_adapter(folder, model_config, state["params"], rank=config.lora_rank,
                                                              base_model=export.adapter_base_model(config), dtype="bfloat16",
                                                              train_encoder=config.vision_encoder == "trained", write=write),
    }  # fmt: skip
    parts = tuple(dict.fromkeys(("hf", *config.publish_parts)))  # hf always: what `trainer.export` and users read
    try:
        for part in parts:
            export.write_final_export(export_dir / part, writers[part])
    except (OSError, UserError) as error:
        checkpoint.print_warning(f"{export_dir}: the Hugging Face export failed ({error}); the weights are in "
                                 f"{export_dir / 'params'}: run python -m trainer.export --run {workdir} --format hf --out DIR")
        return
    if config.publish_dir is not None and jax.process_index() == 0:
        publish_export(workdir, config.publish_dir, config.publish_parts, step=int(jax.device_get(state["step"])))


def publish_export(workdir: pathlib.Path, publish_dir: str, parts: tuple[str, ...], *, step: int) -> None:
    """The run's export at `step` as a new version of `publish_dir`, unless one already holds it."""
    already = publish.published_step(publish_dir, run_identity.identity(workdir), step, parts, warn=checkpoint.print_warning)
    if already is not None:
        print(f"trainer: step {step} of this run is published already, as {already}; nothing new to publish",
              file=sys.stderr, flush=True)
        return
    try:
        version = publish.publish_run(workdir, publish_dir, parts, step=step)
    except (OSError, UserError) as error:
        checkpoint.print_warning(f"{publish_dir}: publishing the export failed ({error}); publish it with "
                                 f"python -m trainer.hf.publish --run {workdir} --publish-dir {publish_dir}"
                                 + "".join(f" --part {part}" for part in parts))
    else:
        print(f"trainer: published {version}", file=sys.stderr, flush=True)  # stdout may be JSON lines
