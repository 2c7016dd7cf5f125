"""The trainer's options as one frozen record (TrainConfig), the tables of what each may be, and the presets."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

from trainer import contract
from trainer.data import chat, formats
from trainer.gemma3 import config as gemma3_config

# The one table of models: name -> Gemma 3 text architecture (trainer.gemma3.config; the vision tower of
# 4B+ is built only for data with images: trainer.model.models.model_config). trainer.model.models builds them and
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
# A vision-language run's image encoder: kept as loaded (frozen, the default: the language model and the
# projector train) or trained too.
VISION_ENCODER = ("frozen", "trained")
# The bytes a checkpoint holds for each trained parameter, by precision: its weight and AdamW's two
# moments (not the gradients, which --precision's 16 and 8 bytes count): float32 4 + 8, lean 2 + 4,
# lean-factored 2 + 2 (its factored second moment is a row and a column a matrix: next to nothing).
CHECKPOINT_BYTES_PER_TRAINED_PARAMETER = {"float32": 12, "lean": 6, "lean-factored": 4}
PRESETS = ("tiny", "tiny-chat", "tiny-vision")
# How reports print on stdout. json: one object a line (trainer.contract), which GKE's logging agent
# turns into a log entry's jsonPayload, for the stack's log-based metrics to read.
LOG_FORMATS = ("text", "json")
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
    vision_encoder: str = "frozen"  # VISION_ENCODER
    vision_encoder_from_step: int = 1  # a trained encoder's first update (trainer.run.optimizer)
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
# `--preset tiny-vision`: the same model with the tiny image encoder, taught to name the shape and colour of
# generated pictures (trainer.data.vision_corpus); its samples answer about pictures it never trained on. A
# document (one picture, 30 tokens) fills a row of 32, 64 pictures a step. A frozen random encoder's features
# give the colour but hardly the shape (32 of 50 held-out pictures right at 300 steps), and trained from step 1
# its features wash out (18): it trains from step 100, once the language model reads them.
PRESET_VALUES["tiny-vision"] = {**PRESET_VALUES["tiny-chat"], "workdir": "runs/vision-demo", "seq_len": 32, "batch_size": 64,
                                "steps": 1000, "eval_interval": 250, "checkpoint_interval": 250, "log_interval": 50,
                                "vision_encoder": "trained", "vision_encoder_from_step": 100}
