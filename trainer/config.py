"""The trainer's options: one table of flags, a YAML file with the same keys, and the `tiny` and `tiny-chat` presets.

Precedence, lowest first: built-in defaults, `--preset`, the `--config` YAML file, the command line.
Every bad value raises `UserError` naming the flag (or the YAML key and file) and what is allowed.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import yaml

from trainer import contract
from trainer.data import chat, formats
from trainer.errors import OneLineParser, UserError, first_line
from trainer.gemma3 import config as gemma3_config

# The one table of models: name -> Gemma 3 text architecture (trainer.gemma3.config; the vision tower of
# 4B+ is neither built nor loaded: this trainer fine-tunes on text). trainer.model.models builds them and
# trainer.model.params_io names their official checkpoints; the stack config offers them (infra.config).
GEMMA3_MODELS = gemma3_config.MODELS
# A Gemma 3 architecture small enough for a laptop CPU, with a tokenizer trained on its data.
TINY = "tiny"


def model_names() -> tuple[str, ...]:
    return (*GEMMA3_MODELS, TINY)

LR_SCHEDULES = ("cosine", "constant")
COMPUTE_DTYPES = ("auto", "bfloat16", "float32")  # auto: trainer.nn.precision's choice for the platform
OPTIMIZER_STATE_DTYPES = ("float32", "bfloat16")  # AdamW's first moment (trainer.run.optimizer)
# What the trained weights and AdamW's state are kept in between steps (trainer.run.optimizer.PRECISIONS).
PRECISIONS = ("float32", "lean", "lean-factored")
# The bytes a checkpoint holds for each trained parameter, by precision: its weight and AdamW's two
# moments (not the gradients, which --precision's 16 and 8 bytes count): float32 4 + 8, lean 2 + 4,
# lean-factored 2 + 2 (its factored second moment is a row and a column a matrix: next to nothing).
CHECKPOINT_BYTES_PER_TRAINED_PARAMETER = {"float32": 12, "lean": 6, "lean-factored": 4}
PRESETS = ("tiny", "tiny-chat")
# How reports print on stdout. json: one object a line (trainer.contract), which GKE's logging agent
# turns into a log entry's jsonPayload, for the stack's log-based metrics to read.
LOG_FORMATS = ("text", "json")
MESH_AXES = ("data", "fsdp")
# auto: the platform's Pallas kernel (splash on TPU, flash on GPU) for rows its block divides, else the
# dense mask (trainer.nn.layers.KERNELS).
ATTENTIONS = ("auto", "dense", "splash", "flash")
# auto: the first of none, dots, full whose step the compiler fits in the chips' memory (trainer.run.step).
REMATS = ("auto", "none", "dots", "full")
# Environment variables that may stand in for the distributed flags (JAX reads the first one itself).
DISTRIBUTED_ENV = {
    "coordinator_address": "JAX_COORDINATOR_ADDRESS",
    "num_processes": "JAX_NUM_PROCESSES",
    "process_id": "JAX_PROCESS_ID",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The resolved options of one run (written to WORKDIR/config.json)."""

    model: str = "gemma3-270m"
    weights: str = "official"  # official | random | a local or gs:// checkpoint path or Hugging Face directory
    tokenizer: str | None = None  # None: the model's official tokenizer (required for `tiny`)
    data: str | None = None  # raw text, JSONL or Parquet file, or a `trainer.data.prepare` output directory
    data_format: str = formats.AUTO  # how a raw --data file is read (trainer.data.formats)
    loss_on: str = chat.COMPLETIONS  # chat data: train the model's turns only, or every token
    on_bad_row: str = formats.FAIL  # a raw --data file's unusable rows: fail or skip (counted)
    seq_len: int = 256
    batch_size: int = 128  # global, over all processes
    grad_accum_steps: int = 1  # micro-batches a step runs the global batch as, one after another
    steps: int | None = None  # None: train `epochs` passes over the data
    epochs: int = 1
    lr: float = 2e-5
    lr_schedule: str = "cosine"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    lora_rank: int = 0
    lora_weights: str | None = None  # a PEFT adapter directory the LoRA run starts from (trainer.hf.load)
    compute_dtype: str = "auto"
    optimizer_state_dtype: str = "float32"  # OPTIMIZER_STATE_DTYPES
    precision: str = "float32"  # PRECISIONS
    attention: str = "auto"  # ATTENTIONS
    remat: str = "auto"  # REMATS
    vocab_chunk: str = "auto"  # auto, none or a number of vocabulary rows (trainer.run.vocab_chunk)
    eval_fraction: float = 0.01
    eval_interval: int = 500
    checkpoint_dir: str | None = None  # None: WORKDIR/checkpoints
    checkpoint_interval: int = 500
    keep_checkpoints: int = 3
    # The fast tier (trainer.run.local_checkpoints): per-host storage, off when None.
    local_checkpoint_dir: str | None = None
    local_checkpoint_interval: str = "auto"  # auto or a number of steps
    # GKE's multi-tier checkpointing (trainer.multitier): the local tier's directory is its volume; the
    # node's replicator backs it up every this many minutes. None: our own local format.
    multi_tier_backup_minutes: int | None = None
    workdir: str = "runs/train"
    seed: int = 0
    preset: str | None = None
    log_interval: int = 10
    log_format: str = "text"
    tensorboard_dir: str | None = None  # None: WORKDIR/tensorboard
    publish_dir: str | None = None  # where the final export is published for serving (trainer.hf.publish)
    publish_parts: tuple[str, ...] = (contract.PUBLISHED_MODEL_DIR,)  # what a version holds (contract.SERVED_PARTS)
    profile_port: int | None = None
    profile_dir: str | None = None
    compilation_cache_dir: str | None = None  # JAX's persistent compilation cache (trainer.run.compile_answers)
    mesh: dict[str, int] = dataclasses.field(default_factory=lambda: {"data": -1, "fsdp": 1})
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    samples: bool = True

    @property
    def resolved_checkpoint_dir(self) -> str:
        return self.checkpoint_dir or str(pathlib.Path(self.workdir) / "checkpoints")

    @property
    def resolved_tensorboard_dir(self) -> str:
        return self.tensorboard_dir or str(pathlib.Path(self.workdir) / "tensorboard")


# `--preset tiny`: the local CPU demo (a few minutes on 2 cores). Data and tokenizer are generated
# in the workdir when not given (see trainer.loop).
PRESET_VALUES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        model="tiny",
        weights="random",
        seq_len=128,
        batch_size=16,
        steps=150,
        lr=3e-3,
        warmup_steps=30,
        weight_decay=0.01,
        eval_fraction=0.05,
        eval_interval=50,
        checkpoint_interval=50,
        log_interval=10,
        workdir="runs/demo",
    ),
}
# `--preset tiny-chat`: the same model taught to answer a generated chat corpus (trainer.data.chat_corpus),
# trained on the model's turns only. Conversations are short (~35 tokens), so a row packs several.
PRESET_VALUES["tiny-chat"] = {**PRESET_VALUES["tiny"], "steps": 300, "warmup_steps": 30, "eval_interval": 100,
                              "checkpoint_interval": 100, "log_interval": 20, "workdir": "runs/chat-demo"}


def _positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _word_or_positive_int(*words: str, counting: str):
    """An argparse type taking one of `words`, or a positive number of `counting`, as text."""
    def parse(text: str) -> str:
        if text in words:
            return text
        try:
            return str(_positive_int(text))
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected {', '.join(words)} or a positive number of {counting}, got {text!r}") from None
    return parse


vocab_chunk_option = _word_or_positive_int("auto", "none", counting="vocabulary rows")
_local_checkpoint_interval = _word_or_positive_int("auto", counting="steps")


def _local_directory(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a directory on this host (host memory or a local disk), got ''")
    if "://" in text:
        raise argparse.ArgumentTypeError(f"expected a directory on this host (host memory or a local disk), got {text!r}: "
                                         "a bucket is --checkpoint-dir's tier")
    return text


def _directory(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a directory (a local folder or a gs:// path), got ''")
    return text


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


SEED_LIMIT = 2**32  # what SentencePiece and numpy's generators take


def _seed(text: str) -> int:
    value = _int(text)
    if not 0 <= value < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to {SEED_LIMIT - 1}, got {text!r}")
    return value


def _port(text: str) -> int:
    value = _int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port from 1 to 65535, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < math.inf:  # also rejects nan
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _published_parts(text: str) -> tuple[str, ...]:
    parts = tuple(part.strip() for part in text.split(","))
    if not parts or any(part not in contract.PUBLISHED_PARTS for part in parts) or len(set(parts)) < len(parts):
        raise argparse.ArgumentTypeError(f"expected some of {', '.join(contract.PUBLISHED_PARTS)}, comma-separated "
                                         f"(e.g. base,adapter), got {text!r}")
    return parts


def _fraction(text: str) -> float:
    value = non_negative_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1), got {text!r}")
    return value


def parse_mesh(text: str) -> dict[str, int]:
    """`data=-1,fsdp=1` -> {"data": -1, "fsdp": 1}; -1 (at most one axis) fills the remaining devices."""
    mesh = {axis: 1 for axis in MESH_AXES}
    for part in text.split(","):
        name, sep, size = part.partition("=")
        name = name.strip()
        if not sep or name not in MESH_AXES:
            raise argparse.ArgumentTypeError(f"expected AXIS=SIZE pairs over {', '.join(MESH_AXES)} (e.g. data=-1,fsdp=4), got {text!r}")
        try:
            mesh[name] = int(size)
        except ValueError:
            raise argparse.ArgumentTypeError(f"axis {name} needs an integer size, got {size!r}") from None
        if mesh[name] == 0 or mesh[name] < -1:
            raise argparse.ArgumentTypeError(f"axis {name} must be a positive size or -1, got {size!r}")
    if list(mesh.values()).count(-1) > 1:
        raise argparse.ArgumentTypeError(f"at most one axis may be -1, got {text!r}")
    return mesh


def format_mesh(sizes: dict[str, int]) -> str:
    return ",".join(f"{axis}={size}" for axis, size in sizes.items())


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
    add("--seq-len", type=_positive_int, help=f"tokens per packed row (default {d.seq_len})")
    add("--batch-size", type=_positive_int, help=f"global batch size in rows, over all processes (default {d.batch_size})")
    add("--grad-accum-steps", type=_positive_int, help="run each step's global batch as this many micro-batches of "
        "--batch-size / N rows, one after another, and update once with the gradient of the whole batch (its tokens' mean): "
        "a global batch whose activations do not fit at once, at the cost of N sequential passes; --batch-size / N must "
        f"divide by the devices (default {d.grad_accum_steps})")
    add("--steps", type=_positive_int, help="training steps; when unset, --epochs passes over the data")
    add("--epochs", type=_positive_int, help=f"passes over the data when --steps is unset (default {d.epochs})")
    add("--lr", type=_positive_float, help=f"peak learning rate (default {d.lr})")
    add("--lr-schedule", choices=LR_SCHEDULES, help=f"after the linear warmup: cosine decay to 0 or constant (default {d.lr_schedule})")
    add("--warmup-steps", type=non_negative_int, help=f"linear warmup steps (default {d.warmup_steps})")
    add("--weight-decay", type=non_negative_float, help=f"AdamW weight decay on matrices (default {d.weight_decay})")
    add("--grad-clip", type=_positive_float, help=f"clip gradients to this global norm (default {d.grad_clip})")
    add("--lora-rank", type=non_negative_int, help=f"LoRA rank; 0 = full fine-tune (default {d.lora_rank})")
    add("--lora-weights", help="a PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) for the LoRA run to "
        "start from, on its base --weights; its r is --lora-rank")
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
    add("--vocab-chunk", type=vocab_chunk_option, help="vocabulary rows the loss takes logits of at a time: a number, or none (all at once); "
        "auto: on TPU the fastest by the compiler's figures that fits, elsewhere none unless [tokens per device, vocab] "
        f"logits pass 2^26 elements, then 16384 (default {d.vocab_chunk})")
    add("--eval-fraction", type=_fraction, help=f"fraction of documents held out for eval loss and perplexity; 0 = no eval (default {d.eval_fraction})")
    add("--eval-interval", type=_positive_int, help=f"steps between evaluations (default {d.eval_interval})")
    add("--checkpoint-dir", help="Orbax checkpoints, a local directory or gs:// path; a run resumes from its latest (default WORKDIR/checkpoints)")
    add("--checkpoint-interval", type=_positive_int, help=f"steps between checkpoints (default {d.checkpoint_interval})")
    add("--keep-checkpoints", type=_positive_int, help=f"checkpoints kept (default {d.keep_checkpoints})")
    add("--local-checkpoint-dir", type=_local_directory, help="a second, fast checkpoint tier on each host's own storage (host "
        "memory or a local disk): every process saves only the shards it holds and its data position there, in "
        f"process-<index>/<step>, keeping the last {contract.LOCAL_CHECKPOINTS_KEPT}; a run resumes from the newer of the two tiers, "
        "the local one only at a step every process holds (default: off)")
    add("--local-checkpoint-interval", type=_local_checkpoint_interval, help="steps between local checkpoints; auto: chosen "
        "from the first local save so that saving costs under 2%% of the step time (default auto)")
    add("--multi-tier-backup-minutes", type=_positive_int, metavar="MINUTES", help="--local-checkpoint-dir is GKE's "
        "multi-tier checkpointing volume (CSI driver multitier-checkpoint.csi.storage.gke.io): JAX joins the job through its "
        "jax-init-info.txt, the local tier saves through Orbax's ReplicatorCheckpointManager, and the node's replicator "
        "copies it to its bucket every MINUTES (default: off, the local tier in its own format)")
    add("--workdir", help=f"run directory: config.json, metrics.jsonl, loss.png, exported params (default {d.workdir})")
    add("--seed", type=_seed, help=f"seed for initialisation and data order (default {d.seed})")
    add("--preset", choices=PRESETS, help="tiny: the local CPU demo (tiny model, random init, generated corpus and tokenizer, short run); "
        "tiny-chat: the same on a generated chat corpus, trained on the model's answers")
    add("--config", help="YAML file whose keys are these flags' names with underscores; flags given here override it")
    add("--log-interval", type=_positive_int, help=f"steps between metric reports (default {d.log_interval})")
    add("--log-format", choices=LOG_FORMATS, help="how reports print on stdout: text (a progress bar on a terminal, a plain line "
        f"elsewhere) or json (one JSON object a line, for Cloud Logging); metrics.jsonl is the same either way (default {d.log_format})")
    add("--tensorboard-dir", help="TensorBoard event directory (default WORKDIR/tensorboard)")
    add("--profile-port", type=_port, help="start the JAX profiler server on this port (for XProf / TensorBoard capture)")
    add("--profile-dir", help="write a profiler trace of a few early steps here, and print where their time went "
        "(trainer.measure.step_profile; step.hlo beside the trace)")
    add("--compilation-cache-dir", type=_directory, help="JAX's persistent compilation cache, a local directory or gs:// path shared by "
        "runs: a restarted run reads its compiled programs back instead of compiling them again; a changed program "
        "misses (default: off)")
    add("--publish-dir", help="publish the final Hugging Face export here as a new version, PUBLISH_DIR/<UTC stamp>-<run>/hf, "
        "the one serving follows (trainer.hf.publish); default: not published")
    add("--publish-parts", type=_published_parts, help="what a published version holds: hf (the merged model) and, for a LoRA "
        "run, base and adapter (the frozen base and the PEFT adapter, which vLLM serves with --enable-lora), exported to "
        f"WORKDIR/export/<part> (default {','.join(d.publish_parts)})")
    add("--mesh", type=parse_mesh, help=f"device mesh axis sizes, -1 fills (default {format_mesh(d.mesh)})")
    add("--coordinator-address", help=f"HOST:PORT of process 0, for multi-process runs (env {DISTRIBUTED_ENV['coordinator_address']})")
    add("--num-processes", type=_positive_int, help=f"number of processes; 1 alone: one process, without cluster detection "
        f"(env {DISTRIBUTED_ENV['num_processes']})")
    add("--process-id", type=non_negative_int, help=f"this process's index (env {DISTRIBUTED_ENV['process_id']})")
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
            argv += [flag, format_mesh(value)]
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
