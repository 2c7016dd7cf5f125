"""Resolving a run's options: the flags' parser, the `--config` YAML file, the environment, and the checks
across options, into one TrainConfig (parse_config)."""

from __future__ import annotations

import argparse
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import yaml

from trainer import contract
from trainer.config import flag_values
from trainer.config.options import (ATTENTIONS, COMPUTE_DTYPES, DISTRIBUTED_ENV, LOG_FORMATS, LR_SCHEDULES, OPTIMIZER_STATE_DTYPES,
                                    PRECISIONS, PRESET_VALUES, PRESETS, REMATS, VISION_ENCODER, TrainConfig,
                                    model_names)
from trainer.data import chat, formats
from trainer.errors import OneLineParser, UserError, first_line


def build_parser() -> argparse.ArgumentParser:
    # Every default is SUPPRESS so that the parsed namespace holds only what the user gave;
    # TrainConfig and PRESET_VALUES hold the defaults.
    parser = OneLineParser(
        prog="python -m trainer",
        description="Fine-tune Gemma 3 (or a tiny Gemma-architecture model on CPU) on packed, masked text batches.",
        argument_default=argparse.SUPPRESS,
    )
    d = TrainConfig()
    add = parser.add_argument
    add("--model", choices=model_names(), help=f"model to fine-tune (default {d.model})")
    add("--weights", help="initial weights: official (Google's pre-trained checkpoint of the model), random, a path of Gemma parameters "
        "as gm.ckpts.save_params and this trainer's export write them, or a Hugging Face Gemma 3 directory (config.json and "
        f"safetensors, e.g. a google/gemma-3-*-it download or python -m trainer.export's output) (default {d.weights})")
    add("--tokenizer", help="SentencePiece model; default the model's official Gemma 3 tokenizer (required for --model tiny)")
    add("--data", help="a raw file, prepared once into WORKDIR/data_cache: text (documents separated by <|endoftext|>), JSON Lines "
        "(.jsonl) or Parquet (.parquet) of text, chat (messages) or prompt/response rows; or a directory made by python -m trainer.data.prepare")
    add("--data-format", choices=formats.DATA_FORMATS, help="how a raw --data file is read; auto: by its extension and first row's "
        f"keys (default {d.data_format})")
    add("--loss-on", choices=chat.LOSS_ON, help="chat and prompt/response data: train on the model's turns only (completions) or "
        f"on every token (all); text is trained on whole (default {d.loss_on})")
    add("--on-bad-row", choices=formats.ON_BAD_ROW, help="a raw --data file's unusable row (not JSON, a key missing, an unknown role, "
        f"empty, too long, no model turn): stop naming its line (fail) or leave it out, counted in the log (skip) (default {d.on_bad_row})")
    add("--seq-len", type=flag_values.positive_int, help=f"tokens per packed row (default {d.seq_len})")
    add("--batch-size", type=flag_values.positive_int, help=f"global batch size in rows, over all processes (default {d.batch_size})")
    add("--grad-accum-steps", type=flag_values.positive_int, help="run each step's global batch as this many micro-batches of "
        "--batch-size / N rows, one after another, and update once with the gradient of the whole batch (its tokens' mean): "
        "a global batch whose activations do not fit at once, at the cost of N sequential passes; --batch-size / N must "
        f"divide by the devices (default {d.grad_accum_steps})")
    add("--steps", type=flag_values.positive_int, help="training steps; when unset, --epochs passes over the data")
    add("--epochs", type=flag_values.positive_int, help=f"passes over the data when --steps is unset (default {d.epochs})")
    add("--lr", type=flag_values.positive_float, help=f"peak learning rate (default {d.lr})")
    add("--lr-schedule", choices=LR_SCHEDULES, help=f"after the linear warmup: cosine decay to 0 or constant (default {d.lr_schedule})")
    add("--warmup-steps", type=flag_values.non_negative_int, help=f"linear warmup steps (default {d.warmup_steps})")
    add("--weight-decay", type=flag_values.non_negative_float, help=f"AdamW weight decay on matrices (default {d.weight_decay})")
    add("--grad-clip", type=flag_values.positive_float, help=f"clip gradients to this global norm (default {d.grad_clip})")
    add("--lora-rank", type=flag_values.non_negative_int, help=f"LoRA rank; 0 = full fine-tune (default {d.lora_rank})")
    add("--lora-weights", help="a PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) for the LoRA run to "
        "start from, on its base --weights; its r is --lora-rank")
    add("--vision-encoder", choices=VISION_ENCODER, help="with images in the data: keep the image encoder as loaded (frozen: the "
        "language model, whole or its LoRA adapters, and the projector train) or train it too (default "
        f"{d.vision_encoder})")
    add("--vision-encoder-from-step", type=flag_values.positive_int, metavar="STEP", help="with --vision-encoder trained: the "
        "encoder's updates start at this step, their rate rising over --warmup-steps to the run's (before it, the language "
        "model and projector learn to read its features as loaded; a random encoder trained from step 1 loses them to "
        f"the early steps' noisy gradients) (default {d.vision_encoder_from_step})")
    add("--compute-dtype", choices=COMPUTE_DTYPES, help="dtype of the forward and backward passes (the master weights stay float32); "
        "auto: bfloat16 on TPU, GPU and CPUs with native bfloat16 instructions, else float32 (default auto)")
    add("--optimizer-state-dtype", choices=OPTIMIZER_STATE_DTYPES, help="dtype of AdamW's first moment: bfloat16 saves 2 bytes a "
        "trained parameter (a fifth of a full fine-tune's state with the float32 masters); the second moment stays float32, since "
        f"squared gradients span more range than bfloat16's 8 mantissa bits keep (default {d.optimizer_state_dtype})")
    add("--precision", choices=PRECISIONS, help="what the trained weights and AdamW's state are kept in between steps: float32 "
        "(16 bytes a trained parameter with the gradients) or lean (bfloat16 weights, gradients and both moments, 8 bytes, each "
        "update rounded stochastically so that small steps are not lost; --optimizer-state-dtype does not apply): half the "
        "state of float32; or lean-factored: lean with each matrix's second moment kept as float32 row and column means "
        f"(Adafactor's factoring), about 6 bytes (docs/fit.md has their quality figures) (default {d.precision})")
    add("--attention", choices=ATTENTIONS, help="how packed rows attend: dense (a [L, L] mask per row), splash (the TPU kernel, "
        "block-sparse over documents and Gemma 3's sliding window) or flash (the GPU kernel, the same without the [L, L] mask); "
        f"auto: splash on TPU when --seq-len is a multiple of 128, flash on GPU when it is one of 64 (default {d.attention})")
    add("--remat", choices=REMATS, help="what the backward pass recomputes: none, dots (keeps matmul and attention outputs) or full (keeps each "
        f"block's input); auto: the first of these whose step the compiler fits in memory (default {d.remat})")
    add("--vocab-chunk", type=flag_values.vocab_chunk_option, help="the loss head's logits held at a time, in vocabulary rows' worth: a number N (the tokens run in chunks "
        "of N rows' worth of logits, ceil(vocabulary / N) of them), or none (all at once); "
        "auto: on TPU the fastest by the compiler's figures that fits, elsewhere none unless [tokens per device, vocab] "
        f"logits pass 2^26 elements, then 16384 (default {d.vocab_chunk})")
    add("--eval-fraction", type=flag_values.fraction, help=f"fraction of documents held out for eval loss and perplexity; 0 = no eval (default {d.eval_fraction})")
    add("--eval-interval", type=flag_values.positive_int, help=f"steps between evaluations (default {d.eval_interval})")
    add("--checkpoint-dir", help="Orbax checkpoints, a local directory or gs:// path; a run resumes from its latest (default WORKDIR/checkpoints)")
    add("--checkpoint-interval", type=flag_values.positive_int, help=f"steps between checkpoints (default {d.checkpoint_interval})")
    add("--keep-checkpoints", type=flag_values.positive_int, help=f"checkpoints kept (default {d.keep_checkpoints})")
    add("--local-checkpoint-dir", type=flag_values.local_directory, help="a second, fast checkpoint tier on each host's own storage (host "
        "memory or a local disk): every process saves only the shards it holds and its data position there, in "
        f"process-<index>/<step>, keeping the last {contract.LOCAL_CHECKPOINTS_KEPT}; a run resumes from the newer of the two tiers, "
        "the local one only at a step every process holds (default: off)")
    add("--local-checkpoint-interval", type=flag_values.local_checkpoint_interval, help="steps between local checkpoints; auto: chosen "
        "from the first local save so that saving costs under 2%% of the step time (default auto)")
    add("--multi-tier-backup-minutes", type=flag_values.positive_int, metavar="MINUTES", help="--local-checkpoint-dir is GKE's "
        "multi-tier checkpointing volume (CSI driver multitier-checkpoint.csi.storage.gke.io): JAX joins the job through its "
        "jax-init-info.txt, the local tier saves through Orbax's ReplicatorCheckpointManager, and the node's replicator "
        "copies it to its bucket every MINUTES (default: off, the local tier in its own format)")
    add("--workdir", help=f"run directory: config.json, metrics.jsonl, loss.png, exported params (default {d.workdir})")
    add("--seed", type=flag_values.seed, help=f"seed for initialisation and data order (default {d.seed})")
    add("--preset", choices=PRESETS, help="tiny: the local CPU demo (tiny model, random init, generated corpus and tokenizer, short run); "
        "tiny-chat: the same on a generated chat corpus, trained on the model's answers; tiny-vision: the same with a "
        "tiny image encoder, on generated pictures of coloured shapes")
    add("--config", help="YAML file whose keys are these flags' names with underscores; flags given here override it")
    add("--log-interval", type=flag_values.positive_int, help=f"steps between metric reports (default {d.log_interval})")
    add("--log-format", choices=LOG_FORMATS, help="how reports print on stdout: text (a progress bar on a terminal, a plain line "
        f"elsewhere) or json (one JSON object a line, for Cloud Logging); metrics.jsonl is the same either way (default {d.log_format})")
    add("--tensorboard-dir", help="TensorBoard event directory (default WORKDIR/tensorboard)")
    add("--profile-port", type=flag_values.port, help="start the JAX profiler server on this port (for XProf / TensorBoard capture)")
    add("--profile-dir", help="write a profiler trace of a few early steps here, and print where their time went "
        "(trainer.measure.step_profile; step.hlo beside the trace)")
    add("--compilation-cache-dir", type=flag_values.directory, help="JAX's persistent compilation cache, a local directory or gs:// path shared by "
        "runs: a restarted run reads its compiled programs back instead of compiling them again; a changed program "
        "misses (default: off)")
    add("--publish-dir", help="publish the final Hugging Face export here as a new version, PUBLISH_DIR/<UTC stamp>-<run>/hf, "
        "the one serving follows (trainer.hf.publish); default: not published")
    add("--publish-parts", type=flag_values.published_parts, help="what a published version holds: hf (the merged model) and, for a LoRA "
        "run, base and adapter (the frozen base and the PEFT adapter, which vLLM serves with --enable-lora), exported to "
        f"WORKDIR/export/<part> (default {','.join(d.publish_parts)})")
    add("--mesh", type=flag_values.parse_mesh, help=f"device mesh axis sizes, -1 fills (default {flag_values.format_mesh(d.mesh)})")
    add("--coordinator-address", help=f"HOST:PORT of process 0, for multi-process runs (env {DISTRIBUTED_ENV['coordinator_address']})")
    add("--num-processes", type=flag_values.positive_int, help=f"number of processes; 1 alone: one process, without cluster detection "
        f"(env {DISTRIBUTED_ENV['num_processes']})")
    add("--process-id", type=flag_values.non_negative_int, help=f"this process's index (env {DISTRIBUTED_ENV['process_id']})")
    add("--samples", action=argparse.BooleanOptionalAction, help=f"print sample generations from fixed prompts before and after training (default {'on' if d.samples else 'off'})")
    return parser


def _yaml_argv(path: str, parser: argparse.ArgumentParser) -> list[str]:
    """Turns the YAML file into flags, so the file and the command line share one validation."""
    try:
        values = yaml.safe_load(pathlib.Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"--config {path}: file not found") from None
    except IsADirectoryError:
        raise UserError(f"--config {path}: a directory; give a YAML file") from None
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise UserError(f"--config {path}: not valid YAML ({first_line(error)})") from None
    if values is None:
        return []
    if not isinstance(values, dict):
        raise UserError(f"--config {path}: expected a mapping of option names to values")
    known = {action.dest for action in parser._actions if action.dest not in ("help", "config")}
    unknown = sorted(str(key) for key in values if key not in known)
    if unknown:
        raise UserError(f"--config {path}: unknown keys {', '.join(unknown)} (keys are the flag names with underscores, e.g. seq_len)")
    argv = []
    for key, value in values.items():
        flag = "--" + key.replace("_", "-")
        if key == "samples":
            if not isinstance(value, bool):
                raise UserError(f"--config {path}: samples expects true or false, got {value!r}")
            argv.append(flag if value else "--no-samples")
        elif key == "mesh" and isinstance(value, dict):
            argv += [flag, flag_values.format_mesh(value)]
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def _parse_yaml(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    argv = _yaml_argv(path, parser)  # its errors name the file already
    try:
        return vars(parser.parse_args(argv))
    except UserError as error:
        raise UserError(f"--config {path}: {error}") from None


def _environment_values() -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, env_name in DISTRIBUTED_ENV.items():
        text = os.environ.get(env_name)
        if text:
            if key == "coordinator_address":
                values[key] = text
            else:
                try:
                    values[key] = int(text)
                except ValueError:
                    raise UserError(f"environment variable {env_name}: expected an integer, got {text!r}") from None
    return values


def parse_config(argv: Sequence[str] | None = None) -> TrainConfig:
    """Resolves defaults, preset, YAML file, environment and flags into one TrainConfig."""
    parser = build_parser()
    command_line = vars(parser.parse_args(argv))
    from_file = _parse_yaml(command_line.pop("config"), parser) if "config" in command_line else {}
    explicit = {**_environment_values(), **from_file, **command_line}
    preset = explicit.get("preset")
    preset_values = PRESET_VALUES[preset] if preset else {}
    run_length = _run_length([preset_values, from_file, command_line])
    config = TrainConfig(**{**preset_values, **explicit, **run_length})
    _check_consistency(config)
    if "vision_encoder_from_step" in explicit and config.vision_encoder != "trained":
        raise UserError(f"--vision-encoder-from-step {config.vision_encoder_from_step} says when a trained image encoder "
                        f"starts to train; this run's encoder is {config.vision_encoder}: add --vision-encoder trained")
    return config


def _run_length(layers: list[dict[str, Any]]) -> dict[str, Any]:
    """--steps and --epochs are two ways to say how long to train: the highest layer that gives one
    decides (an --epochs over a preset's steps trains epochs), and one layer giving both is a contradiction."""
    for layer in reversed(layers):
        if "steps" in layer and "epochs" in layer:
            raise UserError(f"--steps {layer['steps']} and --epochs {layer['epochs']} contradict each other: "
                            "give --steps (a number of steps) or --epochs (passes over the data), not both")
        if "epochs" in layer:
            return {"steps": None}
        if "steps" in layer:
            return {}
    return {}


def _check_consistency(config: TrainConfig) -> None:
    if "://" in config.workdir:
        raise UserError(f"--workdir {config.workdir}: the run directory is a local folder (on GKE the stacks mount the "
                        "artifacts bucket at /artifacts and run there); for a bucket give --checkpoint-dir and "
                        "--publish-dir gs://... and a local --workdir")
    if config.batch_size % config.grad_accum_steps:
        raise UserError(f"--batch-size {config.batch_size} does not split into --grad-accum-steps {config.grad_accum_steps} "
                        "micro-batches: give a batch size that is a multiple of the accumulation steps")
    if config.model == "tiny" and config.weights == "official":
        raise UserError("--model tiny has no official weights: use --weights random or a checkpoint path")
    if not config.lora_rank and set(config.publish_parts) - {contract.PUBLISHED_MODEL_DIR}:
        raise UserError(f"--publish-parts {','.join(config.publish_parts)}: base and adapter are a LoRA run's; this run is a "
                        "full fine-tune (no --lora-rank): publish hf")
    if config.lora_weights and not config.lora_rank:
        raise UserError(f"--lora-weights {config.lora_weights} continues a LoRA run: pass --lora-rank, the adapter's r")
    if config.multi_tier_backup_minutes is not None and config.local_checkpoint_dir is None:
        raise UserError(f"--multi-tier-backup-minutes {config.multi_tier_backup_minutes} needs --local-checkpoint-dir: the "
                        "mount of GKE's multi-tier checkpointing volume")
    if config.local_checkpoint_dir is not None:
        local = pathlib.Path(os.path.abspath(config.local_checkpoint_dir))
        persistent = config.resolved_checkpoint_dir
        if "://" not in persistent and local.is_relative_to(os.path.abspath(persistent)):
            raise UserError(f"--local-checkpoint-dir {config.local_checkpoint_dir} is inside --checkpoint-dir {persistent}: "
                            "the local tier needs a directory of its own, on the host's storage")
    if config.preset is None:
        if config.data is None:
            raise UserError("--data is required: a raw text, JSONL or Parquet file or a python -m trainer.data.prepare directory "
                            "(or use --preset tiny or tiny-chat)")
        if config.model == "tiny" and config.tokenizer is None:
            raise UserError("--model tiny needs --tokenizer (a SentencePiece model), or use --preset tiny")
