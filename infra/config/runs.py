"""gemma-tpu:runs: the runs that share the stack's TPU pools, each the gemma-tpu:training settings
with its own name, priority and slices over them; and the checks every run passes, the one run of a
stack without the list included."""

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from infra.catalog import names
from infra.catalog.tpu import SliceSpec
from infra.config.sections import DNS_LABEL, PROJECT, Section, check_dns_label
from infra.config.slices import TpuConfig
from infra.config.training import PreparationConfig, TrainingConfig, parse_preparation, parse_training
from infra.errors import ConfigError
from trainer import config as trainer_config
from trainer.contract import LOCAL_CHECKPOINTS_KEPT
from trainer.measure import flops

# Run priorities (gemma-tpu:runs[].priority): each is a Kueue WorkloadPriorityClass of this value.
# A higher one is admitted first and may preempt a lower one (which resumes from its checkpoint).
PRIORITIES = {"high": 1000, "normal": 100, "low": 10}
# The local checkpoint tier's volume beyond its steps' shards: each step's data position and meta.json
# (kilobytes), and the rounding up to whole GiB.
LOCAL_TIER_MARGIN_GIB = 1
_GIB = 2**30


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One training run on the stack's TPUs: its settings, its priority in the queue and how many
    of the stack's slices it takes."""

    training: TrainingConfig
    preparation: PreparationConfig
    priority: str  # a key of PRIORITIES
    slices: int  # at most the stack's gemma-tpu:tpu.slices

    @property
    def name(self) -> str:
        return self.training.run_name


def parse_runs(value: Any, training_section: Section, tpu_config: TpuConfig, slice_spec: SliceSpec, *,
               multi_tier: bool = False) -> tuple[RunConfig, ...]:
    """gemma-tpu:runs: a list of runs, each the gemma-tpu:training settings (already checked) with
    its own keys over them."""
    key = f"{PROJECT}:runs"
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f"{key} must be a list of runs, each a mapping with a name, got {value!r}")
    shared = training_section.written()
    if "runName" in shared:
        raise ConfigError(
            f"{training_section.key('runName')} names the single run of a stack without {key}; "
            f"with {key}, give each run its name there (name: ...) and remove runName"
        )
    runs, seen = [], {}
    for index, run_values in enumerate(value):
        if not isinstance(run_values, Mapping):
            raise ConfigError(f"{key}[{index}] must be a mapping of a run's keys (name, priority, training keys), got {run_values!r}")
        section = Section(f"{key}[{index}]", {**shared, **run_values})
        if not section.text("name", ""):
            raise ConfigError(f"{section.key('name')} is required: give the run a name (a-z, 0-9, -)")
        for name, stack_value in (("accelerator", tpu_config.accelerator), ("topology", tpu_config.topology)):
            asked = section.text(name, stack_value)
            if asked != stack_value:
                raise ConfigError(
                    f"{section.key(name)} is {asked!r}, but the stack's TPU pools are {tpu_config.accelerator} "
                    f"{tpu_config.topology} ({PROJECT}:tpu); run it on a stack with such pools or remove the key"
                )
        run = RunConfig(
            training=parse_training(section, name_key="name"),
            preparation=parse_preparation(section),
            priority=section.text("priority", "normal", tuple(PRIORITIES)),
            slices=section.integer("slices", tpu_config.slices, minimum=1, maximum=tpu_config.slices),
        )
        section.reject_unknown()
        if run.name in seen:
            raise ConfigError(f"{section.key('name')} {run.name!r} is also {key}[{seen[run.name]}].name; give each run its own name")
        seen[run.name] = index
        check_run(section, run, tpu_config, slice_spec, name_key="name", multi_tier=multi_tier)
        runs.append(run)
    return tuple(runs)


def check_run(section: Section, run: RunConfig, tpu_config: TpuConfig, slice_spec: SliceSpec, *, name_key: str,
              multi_tier: bool = False) -> None:
    """`multi_tier`: the local tier is on GKE's multi-tier checkpointing volume (gemma-tpu:cluster.multiTierCheckpointing)."""
    run_tpu = replace(tpu_config, slices=run.slices)
    _check_run_name(section.key(name_key), run.name, run_tpu, slice_spec)
    hosts = slice_spec.hosts * run.slices
    if run.training.batch_size % hosts:
        raise ConfigError(
            f"{section.key('batchSize')} is {run.training.batch_size}; it must be divisible by the "
            f"{hosts} hosts of {run.slices} x {slice_spec.topology} slices (each host loads an equal share)"
        )
    accumulation, chips = run.training.grad_accum_steps or 1, slice_spec.chips * run.slices
    if accumulation > 1 and run.training.batch_size % (accumulation * chips):
        raise ConfigError(
            f"{section.key('gradAccumSteps')} is {accumulation}; batchSize {run.training.batch_size} must split into that many "
            f"micro-batches, each a multiple of the {chips} chips of {run.slices} x {slice_spec.topology} slices: give a batchSize "
            f"that is a multiple of {accumulation * chips}, or fewer gradAccumSteps"
        )
    if run.training.fsdp and slice_spec.chips % run.training.fsdp:
        divisors = ", ".join(str(size) for size in range(1, slice_spec.chips + 1) if slice_spec.chips % size == 0)
        raise ConfigError(
            f"{section.key('fsdp')} is {run.training.fsdp}; it must divide the {slice_spec.chips} chips of a "
            f"{slice_spec.topology} slice ({divisors}); `python -m workloads fit --stack NAME --splits` compares them"
        )
    if run.training.local_checkpoint_interval is not None:
        _check_local_tier(section, run.training, slice_spec, multi_tier=multi_tier)


def local_tier_share_bytes(training: TrainingConfig, slice_spec: SliceSpec) -> int:
    """One host's share of a saved step of the train state: the trained parameters' weights and AdamW
    moments (trainer.config.CHECKPOINT_BYTES_PER_TRAINED_PARAMETER), of which a full fine-tune's host
    holds its chips' part of the FSDP group (all of it when the group fits in a host); LoRA's adapters
    are whole on every chip (trainer.measure.memory)."""
    trained = flops.trained_param_count(trainer_config.GEMMA3_MODELS[training.model], training.lora_rank)
    state = trained * trainer_config.CHECKPOINT_BYTES_PER_TRAINED_PARAMETER[training.precision or trainer_config.TrainConfig().precision]
    return state if training.lora_rank else math.ceil(state * min(1, slice_spec.chips_per_host / (training.fsdp or slice_spec.chips)))


def local_tier_bytes_per_host(training: TrainingConfig, slice_spec: SliceSpec) -> int:
    """What the local tier holds at most on each host: the steps it keeps and the one it writes before
    removing the oldest."""
    return (LOCAL_CHECKPOINTS_KEPT + 1) * local_tier_share_bytes(training, slice_spec)


def local_tier_gib(training: TrainingConfig, slice_spec: SliceSpec) -> int:
    """The size of each training pod's memory-backed volume for the local tier."""
    return math.ceil(local_tier_bytes_per_host(training, slice_spec) / _GIB) + LOCAL_TIER_MARGIN_GIB


def _local_tier_needed_gib(training: TrainingConfig, slice_spec: SliceSpec) -> float:
    """The tier's volume and the one more share the trainer holds while a save is written."""
    return local_tier_gib(training, slice_spec) + local_tier_share_bytes(training, slice_spec) / _GIB


def _check_local_tier(section: Section, training: TrainingConfig, slice_spec: SliceSpec, *, multi_tier: bool) -> None:
    """The tier's volume is host memory inside the trainer container's bound, and the trainer holds one
    more share while a save is written: both must fit in it, or the kernel OOM-kills the trainer. On the
    multi-tier volume (a RAM disk of the node, outside the pod) the trainer's bound is lowered by the
    volume: the same sum must fit in the same memory."""
    needed, host = _local_tier_needed_gib(training, slice_spec), slice_spec.trainer_memory_gib
    if needed > host:
        precision = training.precision or trainer_config.TrainConfig().precision
        share = local_tier_share_bytes(training, slice_spec) / _GIB
        # A full fine-tune's leaner precisions, in the table's order (most bytes first): the first whose tier fits is named.
        leaner = [(other, _local_tier_needed_gib(replace(training, precision=other), slice_spec))
                  for other, size in trainer_config.CHECKPOINT_BYTES_PER_TRAINED_PARAMETER.items()
                  if not training.lora_rank and size < trainer_config.CHECKPOINT_BYTES_PER_TRAINED_PARAMETER[precision]]
        fitting = [f"precision: {other} (its tier needs {other_needed:.1f} GiB)" for other, other_needed in leaner if other_needed <= host]
        volume = f"{PROJECT}:cluster.multiTierCheckpointing: the node's RAM disk for" if multi_tier else f"{section.key('localCheckpointInterval')}:"
        raise ConfigError(
            f"{volume} the local checkpoint tier needs {needed:.1f} GiB of host memory on each "
            f"{slice_spec.machine_type} host ({LOCAL_CHECKPOINTS_KEPT + 1} copies of its {share:.1f} GiB share of the {training.model} "
            f"{precision} state, {LOCAL_TIER_MARGIN_GIB} GiB margin, and the copy a save writes from), over the {host} GiB the "
            f"trainer has there; set {fitting[0] + ' or ' if fitting else ''}loraRank, or remove localCheckpointInterval (the persistent tier alone)"
        )


def _check_run_name(key: str, run_name: str, config: TpuConfig, slice_spec: SliceSpec) -> None:
    """The Job / JobSet, pod and coordinator names derived from the run name must be DNS labels, or
    Kubernetes or the JobSet webhook refuses the training object on `pulumi up`."""
    shape = {"slices": config.slices, "hosts_per_slice": slice_spec.hosts}
    limit = names.run_name_max(**shape)
    if not DNS_LABEL.match(run_name):
        check_dns_label(key, run_name, limit)
    over = names.too_long(names.generated_names(run_name, **shape))
    if over:
        what, name = next(iter(over.items()))
        slices = f"{config.slices} slice{'s' if config.slices > 1 else ''} of {config.accelerator} {config.topology}"
        raise ConfigError(
            f"{key} {run_name!r} is too long for {slices}: the {what} would be {name!r} (x: the run's hash), "
            f"{len(name)} characters, and Kubernetes allows {names.DNS_LABEL_MAX}; use at most {limit} characters"
        )
