"""gemma-tpu:training: a run's settings, most of them the trainer's options passed as its flags, and
how the preparation Job reads the run's dataset. gemma-tpu:runs gives each run these keys too."""

from dataclasses import dataclass, fields
from typing import Any

from infra.config.sections import Section
from infra.errors import ConfigError
from trainer import config as trainer_config  # the trainer's options: their defaults and models
from trainer.data import chat, formats

WEIGHTS = ("official", "random")  # or a gs:// checkpoint or Hugging Face directory
TINYSTORIES_URL = (
    "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/TinyStoriesV2-GPT4-train.txt"
)


@dataclass(frozen=True, kw_only=True)
class TrainerOption:
    """A `gemma-tpu:training` key that the training pods pass to the trainer as its flag. Its
    default is the trainer's own (trainer.config.TrainConfig), so a new trainer option is one line
    in TRAINER_OPTIONS; docs/stacks.md's table of these keys is generated from it."""

    key: str  # as written in the stack file
    field: str  # of TrainingConfig (the run's hash covers these names: keep them)
    option: str  # of trainer.config.TrainConfig; its flag is --option-with-dashes
    kind: str  # "text", "integer" or "number"
    minimum: float | None = None  # integers
    maximum: float | None = None
    above: float | None = None  # numbers: the value must be above this
    omitted_with: str | None = None  # not passed when this other field is set (the trainer refuses both)
    choices: tuple[str, ...] = ()  # text: the values allowed
    unset_when_default: bool = False  # kept as None (no flag, not in the run's identity) at the trainer's default
    what: str = ""  # for the docs table

    @property
    def flag(self) -> str:
        return "--" + self.option.replace("_", "-")

    @property
    def default(self) -> Any:
        return getattr(trainer_config.TrainConfig(), self.option)


TRAINER_OPTIONS = (
    TrainerOption(key="model", field="model", option="model", kind="text", what="a Gemma 3 model (tiny is refused: see below)"),
    TrainerOption(key="weights", field="weights", option="weights", kind="text", what="official, random, or a gs:// checkpoint or Hugging Face directory"),
    # Gemma 3's shortest context window is 32K tokens.
    TrainerOption(key="seqLen", field="seq_len", option="seq_len", kind="integer", minimum=16, maximum=32768,
                  what="tokens per packed row"),
    TrainerOption(key="batchSize", field="batch_size", option="batch_size", kind="integer", minimum=1,
                  what="global rows a step, divisible by the stack's TPU hosts"),
    TrainerOption(key="steps", field="steps", option="steps", kind="integer", minimum=1, what="training steps; unset: epochs"),
    TrainerOption(key="epochs", field="epochs", option="epochs", kind="integer", minimum=1, omitted_with="steps",
                  what="passes over the data when steps is unset"),
    TrainerOption(key="learningRate", field="learning_rate", option="lr", kind="number", above=0.0, maximum=1.0,
                  what="peak learning rate"),
    TrainerOption(key="loraRank", field="lora_rank", option="lora_rank", kind="integer", minimum=0, maximum=1024,
                  what="LoRA rank; 0 = full fine-tune"),
    TrainerOption(key="checkpointInterval", field="checkpoint_interval", option="checkpoint_interval", kind="integer",
                  minimum=1, what="steps between checkpoints"),
    # Added after the runs' identities were fixed: at its default it leaves a run's name (and pods) as they were.
    TrainerOption(key="precision", field="precision", option="precision", kind="text", choices=trainer_config.PRECISIONS,
                  unset_when_default=True, what="float32, or lean: bfloat16 weights and AdamW state, 8 bytes a trained "
                  "parameter instead of 16, updates rounded stochastically; or lean-factored: lean with each matrix's second "
                  "moment as row and column means, about 6 (`fit` says when only a lean one fits)"),
    TrainerOption(key="gradAccumSteps", field="grad_accum_steps", option="grad_accum_steps", kind="integer", minimum=1,
                  unset_when_default=True, what="micro-batches a step runs batchSize as, one after another, updating once: "
                  "a global batch larger than fits at once, at N passes a step; batchSize / gradAccumSteps must divide by the chips"),
)  # fmt: skip


def stack_models() -> tuple[str, ...]:
    """The trainer's models a stack may train: its Gemma 3 table (not `tiny`, whose tokenizer is
    trained on the demo's own data and which has no official weights)."""
    return tuple(trainer_config.GEMMA3_MODELS)


@dataclass(frozen=True, kw_only=True)
class TrainingConfig:
    model: str
    weights: str
    dataset: str
    seq_len: int
    batch_size: int  # global, over all hosts of all slices
    steps: int | None  # None = run `epochs` epochs
    epochs: int
    learning_rate: float
    lora_rank: int  # 0 = full fine-tune
    checkpoint_interval: int
    max_restarts: int
    profiling: bool
    run_name: str
    fsdp: int | None = None  # the FSDP group inside a slice; None: all its chips (`python -m workloads fit --splits` compares)
    precision: str | None = None  # --precision; None: the trainer's default (float32)
    local_checkpoint_interval: str | None = None  # --local-checkpoint-interval (auto or steps); None: no local tier
    grad_accum_steps: int | None = None  # --grad-accum-steps; None: the trainer's default (1, no accumulation)


@dataclass(frozen=True, kw_only=True)
class PreparationConfig:
    """How the preparation Job reads a run's dataset: trainer.data.prepare's --data-format, --loss-on and
    --on-bad-row, from gemma-tpu:training.dataFormat, lossOn and onBadRow."""

    data_format: str = formats.AUTO  # auto: by the file's extension and first row
    loss_on: str = chat.COMPLETIONS  # chats and prompt/response pairs: train on the model's turns only
    on_bad_row: str = formats.FAIL

    def flags(self) -> list[str]:
        """trainer.data.prepare's flags (--field-name) for the settings that are not its defaults."""
        defaults = PreparationConfig()
        return [
            arg
            for field in fields(self)
            if getattr(self, field.name) != getattr(defaults, field.name)
            for arg in ("--" + field.name.replace("_", "-"), getattr(self, field.name))
        ]


def parse_training(section: Section, *, name_key: str = "runName") -> TrainingConfig:
    by_key = {option.key: option for option in TRAINER_OPTIONS}
    weights = _read_option(section, by_key["weights"])
    if weights not in WEIGHTS and not weights.startswith("gs://"):
        raise ConfigError(f"{section.key('weights')} is {weights!r}; choose one of {', '.join(WEIGHTS)}, or a gs:// checkpoint or Hugging Face directory")
    dataset = section.text("dataset", TINYSTORIES_URL)
    if not dataset.startswith(("https://", "gs://")):
        raise ConfigError(f"{section.key('dataset')} is {dataset!r}; give an https:// URL or a gs:// path")
    values = {option.field: _read_option(section, option) for option in TRAINER_OPTIONS if option.key != "weights"}
    if values["model"] == trainer_config.TINY:
        raise ConfigError(
            f"{section.key('model')} is {trainer_config.TINY!r}, the trainer's local CPU demo model, whose tokenizer is "
            f"trained on the demo's own data; choose one of {', '.join(stack_models())} (run the demo with `make demo`)"
        )
    if values["model"] not in stack_models():
        raise ConfigError(f"{section.key('model')} is {values['model']!r}; choose one of {', '.join(stack_models())}")
    return TrainingConfig(
        **values,
        weights=weights,
        dataset=dataset,
        max_restarts=section.integer("maxRestarts", 10, minimum=0),
        profiling=section.flag("profiling", False),
        run_name=section.text(name_key, "gemma-finetune"),
        fsdp=section.integer("fsdp", None, minimum=1),
        local_checkpoint_interval=_local_checkpoint_interval(section),
    )


def _local_checkpoint_interval(section: Section) -> str | None:
    """gemma-tpu:training.localCheckpointInterval, as the trainer's --local-checkpoint-interval takes it.
    Not a TrainerOption: unset means no local tier at all (no --local-checkpoint-dir, no volume), where
    the trainer's own default for the flag is auto, which a stack sets by writing it."""
    value = section.raw("localCheckpointInterval")
    auto = trainer_config.TrainConfig().local_checkpoint_interval
    if value is None or value == auto:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{section.key('localCheckpointInterval')} is {value!r}; give {auto} or a number of steps (1 or more), "
                          "or remove the key for no local checkpoint tier")
    return str(value)


def parse_preparation(section: Section) -> PreparationConfig:
    default = PreparationConfig()
    return PreparationConfig(
        data_format=section.text("dataFormat", default.data_format, formats.DATA_FORMATS),
        loss_on=section.text("lossOn", default.loss_on, chat.LOSS_ON),
        on_bad_row=section.text("onBadRow", default.on_bad_row, formats.ON_BAD_ROW),
    )


def _read_option(section: Section, option: TrainerOption) -> Any:
    if option.kind == "integer":
        value = section.integer(option.key, option.default, minimum=option.minimum, maximum=option.maximum)
    elif option.kind == "number":
        return section.number(option.key, option.default, above=option.above, maximum=option.maximum)
    else:
        value = section.text(option.key, option.default, option.choices)
    return None if option.unset_when_default and value == option.default else value


def trainer_flags(training: TrainingConfig) -> list[str]:
    """The trainer flags of the stack's training settings, in TRAINER_OPTIONS order."""
    flags = []
    for option in TRAINER_OPTIONS:
        value = getattr(training, option.field)
        if value is None or (option.omitted_with and getattr(training, option.omitted_with) is not None):
            continue
        flags += [option.flag, repr(value) if option.kind == "number" else str(value)]
    return flags
