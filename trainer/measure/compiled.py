"""The run's training step compiled for a TPU slice on any x86 host, without a TPU: what the TPU
compiler says of its memory per chip and its cost, before any cloud resource exists.

libtpu compiles for a topology it is only told about (`jax.experimental.topologies`); the program is
the trainer's own step (trainer.run.step.build_run_step) with the arguments the loop passes, as shapes
and shardings only. Two figures need care:
- FLOPs and bytes: XLA's cost analysis counts a loop body once, not once per iteration. FSDP's
  large matmuls are loops over the weights' shards, whose missing FLOPs are read from the optimized
  program (trainer.measure.windowed_loops). The step's other loop is the chunked loss
  head (trainer.nn.loss.fused_loss_sum): a loop over token chunks that takes each chunk's logits and
  both gradients in the forward pass. The compiler's cost of one chunk's body (compiled alone on the
  same mesh) times the (chunks - 1) missing iterations is added (trainer.run.vocab_chunk.loop_cost). A Pallas kernel (splash or
  flash attention) carries no cost for the analysis either: its FLOPs are counted from the attended keys
  (forward Q.K and P.V; backward recomputes Q.K and forms dP, dQ, dK, dV: 14 FLOPs per query, key and
  head dimension) and its bytes as its inputs and outputs read and written three times (forward,
  and the backward's reads and gradients).
  With --grad-accum-steps N the whole forward and backward pass is the body of a loop over N micro-batches
  (trainer.run.step): the compiler counts one micro-batch, and the step outside that loop (the optimizer's
  update and the gradient's norm, compiled alone: accumulation_cost) once; the (N - 1) missing micro-batches
  are added, and the vocabulary loop's correction is one micro-batch's, N times.
- Memory: arguments + outputs + temporaries - donated (aliased) + generated code, per chip, against
  the HBM the compiler itself says it can use (it names it when a program does not fit). With
  accumulation the activations are one micro-batch's.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re

import jax
import jax.numpy as jnp
import optax

from trainer.config import CHECKPOINT_BYTES_PER_TRAINED_PARAMETER, TrainConfig
from trainer.errors import UserError, first_line
from trainer.measure import collectives, flops, hbm_traffic, windowed_loops
from trainer.model import models
from trainer.nn import layers, precision
from trainer.run import compile_answers, hardware, hbm, mesh, step, vocab_chunk

# The accelerator names of the stack config and the TPU catalog, as libtpu names a topology's chips.
TOPOLOGY_PREFIX = {"v5e": "v5e", "v5p": "v5p", "v6e": "v6e"}
# The learning-rate schedule's length when the run gives --epochs: the steps per epoch come from its data,
# which a compile does not read, so that step is another program than the run's (no fingerprint).
STEPS_WITHOUT_DATA = 1000
_GIB = 2**30
# What fit compiles, in this order, for a float32 full fine-tune that does not fit (--precision's leaner settings).
LEAN_PRECISIONS = ("lean", "lean-factored")


def tpu_devices(accelerator: str, topology: str, *, num_slices: int = 1) -> list:
    """Compile-only devices of `num_slices` slices of `accelerator` `topology` (e.g. v6e, 2x4)."""
    if accelerator not in TOPOLOGY_PREFIX:
        raise UserError(f"accelerator {accelerator!r}: the TPU compiler knows {', '.join(TOPOLOGY_PREFIX)}")
    # libtpu reads the local TPU VM's metadata at start-up and, on a host that is none, prints warnings
    # about TPU_ACCELERATOR_TYPE and TPU_WORKER_HOSTNAMES. Compiling needs neither: these quiet it.
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", f"{accelerator}-1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    # A TPU VM's chips belong to one process at a time (libtpu's lockfile); compiling uses none of them.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    try:
        return list(topologies.get_topology_desc(platform="tpu", topology_name=f"{TOPOLOGY_PREFIX[accelerator]}:{topology}",
                                                 num_slices=num_slices).devices)
    except (RuntimeError, ValueError) as error:
        reason = first_line(error)
        raise UserError(f"topology {accelerator} {topology} x {num_slices} slice(s): the TPU compiler refuses it ({reason})") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompiledStep:
    device_kind: str
    chips: int
    batch_size: int
    attention: str  # dense or a kernel (trainer.nn.layers.KERNELS), as --attention auto chose
    remat: str  # the rematerialisation policy that fits, as --remat auto chose
    vocab_chunk: int | None  # the loss head's vocabulary chunk, as --vocab-chunk auto chose (None: plain logits)
    arguments: int
    outputs: int
    temporaries: int
    aliased: int
    generated_code: int
    bytes_per_chip: int  # the whole program: trainer.run.hbm.needed_bytes, what the step's search checks
    flops_reported: float  # the compiler's cost analysis, loop bodies counted once
    flops_loop_correction: float  # the vocabulary loop's iterations it left out (see the module docstring)
    flops_windowed_loops: float  # FSDP's windowed matmul loops' iterations it left out (trainer.measure.windowed_loops)
    flops_kernels: float  # the Pallas kernels' count, which the analysis has not
    bytes_reported: float
    bytes_loop_correction: float
    bytes_kernels: float
    ici_bytes: int  # what the program's collectives move per chip (trainer.measure.collectives)
    bytes_by_source: dict[str, int]  # HBM bytes per chip by the JAX operation they come from (trainer.measure.hbm_traffic)
    total_steps: int  # the learning-rate schedule's length compiled into the step
    grad_accum_steps: int = 1  # micro-batches of batch_size / grad_accum_steps rows, one after another
    flops_accumulation: float = 0.0  # the micro-batches after the first, which the analysis leaves out (accumulation_cost)
    bytes_accumulation: float = 0.0
    fingerprint: str | None  # of the lowered program: equal to the one the run records in config.json (None: --epochs)
    l_by_l_tensor: bool | None  # an [..., L, L] tensor in the optimized program (None: head_dim == L, cannot tell)
    remat_speeds: tuple[step.RematSpeed, ...] = ()  # --remat auto: the policies compared (trainer.run.step)

    @property
    def flops_per_chip(self) -> float:
        return (self.flops_reported + self.flops_loop_correction + self.flops_windowed_loops + self.flops_kernels
                + self.flops_accumulation)

    @property
    def bytes_accessed(self) -> float:
        return self.bytes_reported + self.bytes_loop_correction + self.bytes_kernels + self.bytes_accumulation

    def figures(self) -> dict[str, float]:
        """What a step moves per chip: its FLOPs, HBM bytes and collectives' bytes."""
        return {"flops": self.flops_per_chip, "bytes": self.bytes_accessed, "ici": float(self.ici_bytes)}

    def times(self) -> dict[str, float]:
        """Seconds a step takes at the chip's peak for its FLOPs, its HBM bandwidth for its bytes, its ICI for its collectives."""
        return step_times(self.device_kind, self.figures())

    def bound(self) -> tuple[float, str]:
        """(seconds, what bounds them): the step can be no faster than its slowest resource (times)."""
        return slowest(self.times())


def step_times(device_kind: str, figures: dict[str, float]) -> dict[str, float]:
    """CompiledStep.times of a step's `figures` (CompiledStep.figures) on a chip of `device_kind`."""
    chip = hardware.CHIPS[device_kind]
    return {"flops": figures["flops"] / chip.peak_bf16_flops, "bytes": figures["bytes"] / chip.hbm_bytes_per_s,
            "ici": figures["ici"] / chip.ici_bytes_per_s if chip.ici_bytes_per_s else 0.0}


def slowest(times: dict[str, float]) -> tuple[float, str]:
    """(seconds, the resource): the largest of `times`."""
    bound_by = max(times, key=times.get)
    return times[bound_by], bound_by


def kernel_cost(run_step: step.RunStep, config: TrainConfig, model_config) -> tuple[float, float]:
    """(FLOPs, bytes) per chip of the attention kernels (splash, flash), which the cost analysis cannot see."""
    if run_step.layers.attention not in layers.KERNELS:
        return 0.0, 0.0
    tokens_per_chip = config.batch_size * config.seq_len / run_step.device_mesh.size
    heads, kv_heads, head_dim = model_config.num_heads, model_config.num_kv_heads, model_config.head_dim
    contexts = [flops.attention_context(kind, config.seq_len, model_config.sliding_window_size) for kind in model_config.attention_types]
    kernel_flops = 14 * heads * head_dim * sum(contexts) * tokens_per_chip
    itemsize = jnp.dtype(run_step.compute_dtype).itemsize
    kernel_bytes = 3 * len(contexts) * tokens_per_chip * head_dim * (2 * heads + 2 * kv_heads) * itemsize
    encoder_flops, encoder_bytes = _encoder_kernel_cost(run_step, config, model_config)
    return kernel_flops + encoder_flops, kernel_bytes + encoder_bytes


def _encoder_kernel_cost(run_step: step.RunStep, config: TrainConfig, model_config) -> tuple[float, float]:
    """(FLOPs, bytes) per chip of a vision-language step's image encoder attention where it runs in the splash
    kernel (trainer.gemma3.vision): every patch sees every patch, 4 FLOPs a pair and width forward; a frozen
    encoder runs forward only, a trained one also the kernel's backward (the 14 of kernel_cost's 4 + 10)."""
    vision = model_config.vision
    if vision is None or not run_step.images_per_row or run_step.layers.attention != "splash" \
            or vision.patches_per_side**2 % layers.KERNELS["splash"].block:
        return 0.0, 0.0
    images_per_chip = config.batch_size * run_step.images_per_row / run_step.device_mesh.size
    patches, passes = vision.patches_per_side**2, (14 if config.vision_encoder == "trained" else 4)
    kernel_flops = passes * patches * patches * vision.width * vision.depth * images_per_chip
    itemsize = jnp.dtype(run_step.compute_dtype).itemsize
    kernel_bytes = (3 if config.vision_encoder == "trained" else 1) * 4 * patches * vision.width * vision.depth * images_per_chip * itemsize
    return kernel_flops, kernel_bytes


def _mesh_and_dtype(config: TrainConfig, devices, num_slices: int):
    device_mesh = mesh.build_mesh(config.mesh, slices=num_slices, devices=devices)
    mesh.check_batch(config.batch_size, device_mesh, grad_accum_steps=config.grad_accum_steps)
    return device_mesh, precision.compute_dtype(config.compute_dtype, backend=devices[0].platform)


def schedule_steps(config: TrainConfig) -> int:
    """The learning-rate schedule's length the run compiles into its step: its --steps (trainer.loop)."""
    return config.steps or STEPS_WITHOUT_DATA


def lower_train_step(config: TrainConfig, model_config, devices, *, num_slices: int):
    """(run_step, lowered train step) for `devices`, built as trainer.loop builds it (with the first
    policy of --remat)."""
    device_mesh, compute_dtype = _mesh_and_dtype(config, devices, num_slices)
    run_step = step.build_run_step(config, model_config, device_mesh, total_steps=schedule_steps(config), compute_dtype=compute_dtype)
    return run_step, run_step.functions.train.lower(*step.abstract_train_args(run_step, config, model_config))


def compile_train_step(config: TrainConfig, model_config, devices, *, num_slices: int = 1, images_per_row: int = 0) -> CompiledStep:
    """The step compiled for `devices` as trainer.loop compiles it (--remat and --vocab-chunk auto: as
    compile_fastest settles them); raises hbm.MemoryRefusal when the compiler refuses it. A
    vision-language `model_config`'s rows hold `images_per_row` images."""
    device_mesh, compute_dtype = _mesh_and_dtype(config, devices, num_slices)
    run_step = step.build_run_step(config, model_config, device_mesh, total_steps=schedule_steps(config), compute_dtype=compute_dtype,
                                   images_per_row=images_per_row)
    run_step, lowered, compiled = compile_fastest(
        run_step, config, model_config, train_args=lambda candidate: step.abstract_train_args(candidate, config, model_config))
    return compiled_step(run_step, lowered, compiled, config, model_config)


def compile_fastest(run_step: step.RunStep, config: TrainConfig, model_config, *, train_args):
    """trainer.run.step.compile_run_step with --remat auto choosing by speed_estimate: what the trainer, the
    benchmarks and `fit` all compile."""
    devices = list(run_step.device_mesh.devices.flat)
    return step.compile_run_step(run_step, config, model_config, train_args=train_args,
                                 estimate=speed_estimate(config, model_config, devices), kept_speed=kept_speed(devices))


def speed_estimate(config: TrainConfig, model_config, devices):
    """compile_run_step's `estimate` for a run on `devices`: a candidate's bound (CompiledStep.bound), from
    figures kept in the compilation cache where a start before worked them out (compile_answers.figures_kept);
    None for devices of no known peak (the CPU), where --remat auto takes the first policy that fits."""
    if devices[0].device_kind not in hardware.CHIPS:
        return None

    def estimate(candidate: step.RunStep, lowered, compiled) -> step.RematSpeed:
        figures = compile_answers.figures_kept(
            lowered, devices, figures=lambda: compiled_step(candidate, lowered, compiled, config, model_config).figures())
        return _speed(candidate, devices, figures)

    return estimate


def kept_speed(devices):
    """compile_run_step's `kept_speed` for a run on `devices`: the speed_estimate a start before kept of a candidate's program."""

    def kept(candidate: step.RunStep, lowered) -> step.RematSpeed | None:
        figures = compile_answers.kept_figures(lowered, devices) if devices[0].device_kind in hardware.CHIPS else None
        return None if figures is None else _speed(candidate, devices, figures)

    return kept


def _speed(candidate: step.RunStep, devices, figures: dict[str, float]) -> step.RematSpeed:
    seconds, bound_by = slowest(step_times(devices[0].device_kind, figures))
    return step.RematSpeed(remat=candidate.layers.remat, seconds=seconds, bound_by=bound_by)


def compiled_step(run_step: step.RunStep, lowered, compiled, config: TrainConfig, model_config) -> CompiledStep:
    """What the compiler says of `run_step`'s compiled train step, per chip, with the corrections of the module docstring."""
    devices = list(run_step.device_mesh.devices.flat)
    memory = compiled.memory_analysis()
    accumulation = config.grad_accum_steps
    loop_flops, loop_bytes = (accumulation * figure for figure in vocab_chunk.loop_cost(
        run_step.device_mesh, run_step.compute_dtype, tokens=step.micro_batch_size(config) * config.seq_len,
        embed_dim=model_config.embed_dim, vocab_size=model_config.num_embed, chunk=run_step.vocab_chunk, softcap=run_step.softcap,
        embedding_gradient=not config.lora_rank))
    attention_flops, attention_bytes = kernel_cost(run_step, config, model_config)
    cost = _cost(compiled)
    accumulation_flops, accumulation_bytes = accumulation_cost(run_step, config, model_config, cost)
    hlo = compiled.as_text()
    return CompiledStep(
        device_kind=devices[0].device_kind, chips=len(devices), batch_size=config.batch_size,
        attention=run_step.layers.attention, remat=run_step.layers.remat, vocab_chunk=run_step.vocab_chunk,
        arguments=memory.argument_size_in_bytes, outputs=memory.output_size_in_bytes,
        temporaries=memory.temp_size_in_bytes, aliased=memory.alias_size_in_bytes,
        generated_code=memory.generated_code_size_in_bytes, bytes_per_chip=hbm.needed_bytes(compiled),
        flops_reported=cost[0], flops_loop_correction=loop_flops,
        flops_windowed_loops=windowed_loops.missing_flops(hlo), flops_kernels=attention_flops,
        bytes_reported=cost[1], bytes_loop_correction=loop_bytes, bytes_kernels=attention_bytes,
        grad_accum_steps=accumulation, flops_accumulation=accumulation_flops, bytes_accumulation=accumulation_bytes,
        ici_bytes=collectives.collective_bytes(hlo), bytes_by_source=hbm_traffic.by_source(hlo),
        total_steps=schedule_steps(config), fingerprint=step.step_fingerprint(lowered) if config.steps else None,
        l_by_l_tensor=_has_l_by_l_tensor(hlo, config.seq_len, model_config.head_dim),
        remat_speeds=run_step.remat_speeds,
    )


def _cost(compiled) -> tuple[float, float]:
    """(FLOPs, bytes accessed) per chip, as the compiler's cost analysis counts them."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def accumulation_cost(run_step: step.RunStep, config: TrainConfig, model_config, step_cost: tuple[float, float]) -> tuple[float, float]:
    """(FLOPs, bytes) per chip of the micro-batches the cost analysis leaves out of a step with --grad-accum-steps N:
    it counts the loop over them once, so (N - 1) times what it counted of the step (`step_cost`) less what runs
    once a step outside the loop: the optimizer's update and the gradient's norm, compiled alone here on the
    state's shapes and shardings."""
    if config.grad_accum_steps == 1:
        return 0.0, 0.0
    state = step.abstract_train_args(run_step, config, model_config)[0]
    grads = state["params"]
    optimizer = run_step.optimizer

    def update(state, grads):
        updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
        norm = optax.tree.norm(jax.tree.map(lambda g: g.astype(jnp.float32), grads))
        return optimizer.apply_updates(state["params"], updates), opt_state, norm

    lowered = jax.jit(update, donate_argnums=0, out_shardings=(run_step.state_shardings["params"],
                                                                run_step.state_shardings["opt_state"], None)).lower(state, grads)
    once = _cost(compile_answers.compile(lowered, what="the optimizer's update alone (to count the micro-batches)",
                                         devices=list(run_step.device_mesh.devices.flat)))
    return tuple((config.grad_accum_steps - 1) * max(counted - outside, 0.0) for counted, outside in zip(step_cost, once))


def _has_l_by_l_tensor(hlo: str, seq_len: int, head_dim: int) -> bool | None:
    """Whether the optimized program holds an [..., L, L] tensor (the dense attention's mask or logits);
    None where the head width equals L, whose [.., head_dim, head_dim] squares (attention's projections
    and their gradients) look the same."""
    if head_dim == seq_len:
        return None
    return re.search(rf"\[(\d+,)*{seq_len},{seq_len}\]", hlo) is not None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fit:
    """What `fit` reports of one run on one slice shape (keys of `python -m workloads fit --json`)."""

    config: TrainConfig
    model_config: object
    compiled: CompiledStep | None  # None: the run's own batch does not fit
    refused: hbm.MemoryRefusal | None
    usable_hbm: int
    largest_batch: LargestBatch | None  # None: not searched
    # A float32 full fine-tune refused: (the precision, its step): lean, or lean-factored where lean does not fit either.
    lean: tuple[str, CompiledStep | hbm.MemoryRefusal] | None = None
    splits: tuple[Fit, ...] = ()  # with compare_splits: this one and the step compiled for each other FSDP group
    # The run's batch refused: the least --grad-accum-steps whose micro-batches fit (accumulation_that_fits), compiled.
    accumulation: tuple[int, CompiledStep] | None = None
    # A float32 full fine-tune that fits: the same run with --precision lean-factored, compiled where it fits too.
    leaner: CompiledStep | None = None
    images_per_row: int = 0  # a vision-language run's images a row (0: a text run)

    def report(self) -> dict:
        result = self._figures()
        if self.splits:
            rows = [split_figures(split._figures()) for split in self.splits]
            fitting = [row for row in rows if row["fits"]]
            result |= {"splits": rows, "best_mesh": min(fitting, key=lambda row: row["step_time_bound_s"])["mesh"] if fitting else None}
        return result

    def _figures(self) -> dict:
        config, model_config, searched = self.config, self.model_config, self.largest_batch
        tokens = config.batch_size * config.seq_len
        params = flops.param_count(model_config)
        trained = flops.trained_param_count(model_config, config.lora_rank)
        images = dict(images_per_row=self.images_per_row, train_encoder=config.vision_encoder == "trained")
        flops_per_token = flops.training_flops_per_token(model_config, config.seq_len, lora_rank=config.lora_rank, **images)
        result = {
            "model": config.model, "lora_rank": config.lora_rank, "batch_size": config.batch_size, "seq_len": config.seq_len,
            "mesh": dict(config.mesh), "params": params, "trained_params": trained, "tokens_per_step": tokens,
            "usable_hbm_bytes_per_chip": self.usable_hbm,
            "largest_batch": searched.batch if searched else None, "largest_batch_remat": searched.remat if searched else None,
            "precision": config.precision, "grad_accum_steps": config.grad_accum_steps,
            "micro_batch_size": step.micro_batch_size(config),
        }
        if model_config.vision is not None:  # what the images take of a row and of the step's arithmetic
            result |= {"images_per_row": self.images_per_row,
                       "image_tokens_share": self.images_per_row * model_config.vision.soft_tokens / config.seq_len,
                       "image_flops_share": flops.image_flops_per_token(model_config, config.seq_len, **images) / flops_per_token}
        if self.accumulation is not None:
            steps, accumulated = self.accumulation
            result |= {"grad_accum_steps_that_fit": steps, "grad_accum_compiled_bytes_per_chip": accumulated.bytes_per_chip}
        if self.leaner is not None and self.compiled is not None:
            result |= {"faster_precision": LEAN_PRECISIONS[-1], "faster_remat": self.leaner.remat,
                       "faster_speedup": self.compiled.bound()[0] / self.leaner.bound()[0],
                       "faster_compiled_bytes_per_chip": self.leaner.bytes_per_chip}
        if self.lean is not None:
            precision, lean = self.lean
            result |= {"lean_precision": precision, "lean_fits": _fits(lean, self.usable_hbm), "lean_compiled_bytes_per_chip": _needed(lean)}
        if self.compiled is None:
            refused = self.refused
            return {**result, "fits": False, "compiled_bytes_per_chip": refused.required, "headroom_gib": round(
                (refused.available - refused.required) / _GIB, 2), "refused_for": refused.what}
        compiled = self.compiled
        chip = hardware.CHIPS[compiled.device_kind]
        model_flops = flops_per_token * tokens
        bound_s, bound_by = compiled.bound()
        return {
            **result,
            "device_kind": compiled.device_kind, "chips": compiled.chips, "hbm_bytes_per_chip": chip.hbm_bytes,
            "compiled_bytes_per_chip": compiled.bytes_per_chip,
            "compiled_parts": {"arguments": compiled.arguments, "outputs": compiled.outputs, "temporaries": compiled.temporaries,
                               "aliased": compiled.aliased, "generated_code": compiled.generated_code},
            "flops_per_chip_per_step": compiled.flops_per_chip, "flops_reported_by_compiler": compiled.flops_reported,
            "flops_loop_correction": compiled.flops_loop_correction, "flops_windowed_loops": compiled.flops_windowed_loops,
            "flops_attention_kernels": compiled.flops_kernels, "model_flops_per_chip_per_step": model_flops / compiled.chips,
            "bytes_accessed_per_chip": compiled.bytes_accessed, "bytes_reported_by_compiler": compiled.bytes_reported,
            "bytes_by_source_per_chip": compiled.bytes_by_source,
            "ici_bytes_per_chip": compiled.ici_bytes, "step_time_bound_s": bound_s, "bound_by": bound_by,
            "mfu_bound": model_flops / compiled.chips / chip.peak_bf16_flops / bound_s,
            "fits": compiled.bytes_per_chip <= self.usable_hbm,
            "headroom_gib": round((self.usable_hbm - compiled.bytes_per_chip) / _GIB, 2),
            "attention": compiled.attention, "remat": compiled.remat, "vocab_chunk": compiled.vocab_chunk,
            "remat_speeds": [dataclasses.asdict(speed) for speed in compiled.remat_speeds],
            "l_by_l_tensor": compiled.l_by_l_tensor,
            "total_steps": compiled.total_steps, "step_fingerprint": compiled.fingerprint,
        }


_SPLIT_KEYS = ("mesh", "fits", "compiled_bytes_per_chip", "headroom_gib", "remat", "vocab_chunk", "ici_bytes_per_chip",
               "step_time_bound_s", "bound_by", "mfu_bound")


def split_figures(report: dict) -> dict:
    """What `fit --splits` compares of one FSDP group (a refused one has no cost figures)."""
    return {key: report[key] for key in _SPLIT_KEYS if key in report}


_SEARCH_STEPS = 5  # largest_batch's compiles at most: a second batch for the line, then up to 4 guesses


@dataclasses.dataclass(frozen=True)
class LargestBatch:
    batch: int  # a multiple of the chips; 0: not one row a chip fits
    remat: str  # the rematerialisation policy of every compile of the search, hence of the answer


def _try_compile(config: TrainConfig, model_config, devices, num_slices: int, *, why: str,
                 images_per_row: int = 0) -> CompiledStep | hbm.MemoryRefusal:
    with compile_answers.doing(f"{why}, batch {config.batch_size}"):
        try:
            return compile_train_step(config, model_config, devices, num_slices=num_slices, images_per_row=images_per_row)
        except hbm.MemoryRefusal as refused:
            return refused


def _needed(result: CompiledStep | hbm.MemoryRefusal) -> int:
    return result.bytes_per_chip if isinstance(result, CompiledStep) else result.required


def _fits(result: CompiledStep | hbm.MemoryRefusal, usable: int) -> bool:
    return isinstance(result, CompiledStep) and result.bytes_per_chip <= usable


def search_config(config: TrainConfig, first: CompiledStep | hbm.MemoryRefusal) -> TrainConfig:
    """`config` with the policy the batch search holds: a step's memory is a line in the batch only for one
    rematerialisation policy and loss head. That of the run's step when it fits, otherwise the last of
    --remat's candidates (the one that recomputes most, where a refused --remat auto ended)."""
    if isinstance(first, CompiledStep):
        return dataclasses.replace(config, remat=first.remat, vocab_chunk=str(first.vocab_chunk or "none"))
    return dataclasses.replace(config, remat=step.remat_candidates(config.remat)[-1])


def largest_batch(config: TrainConfig, model_config, devices, *, num_slices: int, usable: int,
                  first: CompiledStep | hbm.MemoryRefusal, images_per_row: int = 0) -> LargestBatch:
    """The largest global batch (a multiple of the chips) whose step fits with one policy (search_config),
    from the compiler: memory per chip is affine in the batch, so two compiles give the line, and a third
    checks its answer (stepping down while the compiler refuses it). Only a compiled answer counts: the
    run's own batch, when it fits, is the least one. With --grad-accum-steps N the search is the micro-batch's
    (whose activations a chip holds): global batches of N micro-batches, each a multiple of the chips."""
    unit = len(devices) * config.grad_accum_steps
    search = search_config(config, first)
    other_batch = config.batch_size * 2 if config.batch_size > unit else config.batch_size + unit
    if isinstance(first, hbm.MemoryRefusal) and config.batch_size > unit:
        other_batch = max(unit, config.batch_size // 4 // unit * unit)
    other = _try_compile(dataclasses.replace(search, batch_size=other_batch), model_config, devices, num_slices,
                         why=f"largest batch (remat {search.remat}): search step 1 of at most {_SEARCH_STEPS}", images_per_row=images_per_row)
    results = {config.batch_size: first, other_batch: other}
    (b1, m1), (b2, m2) = sorted((batch, _needed(result)) for batch, result in results.items())
    per_row = max((m2 - m1) / (b2 - b1), 1.0)
    guess = int((usable - (m1 - per_row * b1)) / per_row) // unit * unit
    for search_step in range(2, _SEARCH_STEPS + 1):
        fitting = max((batch for batch, result in results.items() if _fits(result, usable)), default=0)
        if guess <= fitting:
            break
        if guess not in results:
            results[guess] = _try_compile(dataclasses.replace(search, batch_size=guess), model_config, devices, num_slices,
                                          why=f"largest batch (remat {search.remat}): search step {search_step} of at most {_SEARCH_STEPS}",
                                          images_per_row=images_per_row)
        if _fits(results[guess], usable):
            break
        guess -= unit * max(1, math.ceil((_needed(results[guess]) - usable) / per_row / unit))
    return LargestBatch(max((batch for batch, result in results.items() if _fits(result, usable)), default=0), search.remat)


def fit(config: TrainConfig, devices, *, num_slices: int = 1, vocab_size: int | None = None, search_batch: bool = True,
        compare_splits: bool = False, compare_precision: bool = True, refused: hbm.MemoryRefusal | None = None,
        images_per_row: int = 0) -> Fit:
    """Compile `config`'s step for `devices`; `vocab_size` sizes only the tiny model (its tokenizer's).
    `compare_splits` compiles it again for every other FSDP group that divides a slice (split_figures). A
    full fine-tune in float32 that does not fit is compiled again with --precision lean, and where that does
    not fit either with lean-factored; the report says the last tried (`lean_precision`) and whether it fits
    (`lean_fits`). With `compare_precision`, one that fits is compiled again with lean-factored, and the report has its bound's speed-up
    (`faster_speedup`: the run's bound over lean-factored's) where that fits too; precision stays the user's
    choice (lean's quality, docs/fit.md). `refused`: the compiler's refusal of the run's own step, already
    known (the trainer's), which is then not compiled again. `images_per_row`: a vision-language run's rows
    hold that many images each (the model's image encoder compiled in; 0: the text model)."""
    model_config = models.model_config(config.model, vocab_size=vocab_size or 0, images=images_per_row > 0)
    usable = hbm.usable_hbm_bytes(devices)
    compile_ = functools.partial(_try_compile, model_config=model_config, devices=devices, num_slices=num_slices,
                                 images_per_row=images_per_row)
    first = refused or compile_(config, why=f"the run's step, mesh {_mesh_name(config.mesh)}")
    batch = largest_batch(config, model_config, devices, num_slices=num_slices, usable=usable, first=first,
                          images_per_row=images_per_row) if search_batch else None
    lean = None
    if not _fits(first, usable) and config.precision == "float32" and not config.lora_rank:
        for precision in LEAN_PRECISIONS:
            if _needed(first) - _lean_savings(model_config, precision) > usable:
                continue  # the bytes it saves, even unsharded, are fewer than the step is over: not worth a compile
            lean = precision, compile_(dataclasses.replace(config, precision=precision),
                                       why=f"the run's step with --precision {precision} (a larger state does not fit)")
            if _fits(lean[1], usable):
                break
    leaner = None
    if compare_precision and _fits(first, usable) and config.precision == "float32" and not config.lora_rank:
        faster = compile_(dataclasses.replace(config, precision=LEAN_PRECISIONS[-1]),
                          why=f"the run's step with --precision {LEAN_PRECISIONS[-1]} (is it faster?)")
        leaner = faster if _fits(faster, usable) else None
    accumulation = None
    if not _fits(first, usable) and batch is not None and batch.batch:
        accumulation = accumulation_that_fits(config, model_config, devices, num_slices=num_slices, usable=usable, largest=batch,
                                              images_per_row=images_per_row)
    own = Fit(config=config, model_config=model_config, compiled=first if isinstance(first, CompiledStep) else None,
              refused=first if isinstance(first, hbm.MemoryRefusal) else None, usable_hbm=usable, largest_batch=batch, lean=lean,
              accumulation=accumulation, leaner=leaner, images_per_row=images_per_row)
    if not compare_splits:
        return own
    others = [fit(dataclasses.replace(config, mesh=sizes), devices, num_slices=num_slices, vocab_size=vocab_size, search_batch=False,
                  compare_precision=False, images_per_row=images_per_row)
              for sizes in split_meshes(len(devices) // num_slices) if sizes != config.mesh]
    return dataclasses.replace(own, splits=(own, *others))


# What a refused run may change, as the trainer's flags name it (fit's advice names the stack's keys).
TRAINER_FLAGS = {"precision": "--precision", "grad_accum_steps": "--grad-accum-steps", "batch_size": "--batch-size"}


def fitting_settings(report: dict, names: dict[str, str]) -> list[str]:
    """What fit's search found that fits a run whose step does not, a phrase each with its figures; `names`:
    what the user sets each by (TRAINER_FLAGS, or the stack's keys: workloads.fit.advice)."""
    found = []
    if report.get("lean_fits"):
        state = "bfloat16 weights and AdamW state" + (", the second moment factored" if report["lean_precision"] == "lean-factored" else "")
        found.append(f"{names['precision']} {report['lean_precision']} ({state}: {report['lean_compiled_bytes_per_chip'] / _GIB:.1f} "
                     "GiB per chip, which fits; docs/fit.md has its quality figures)")
    if report.get("grad_accum_steps_that_fit"):
        steps = report["grad_accum_steps_that_fit"]
        found.append(f"{names['grad_accum_steps']} {steps} (the same batch as {steps} micro-batches of {report['batch_size'] // steps} "
                     f"rows, one after another: {report['grad_accum_compiled_bytes_per_chip'] / _GIB:.1f} GiB per chip, which fits)")
    if report["largest_batch"]:
        found.append(f"{names['batch_size']} {report['largest_batch']} or less (it fits with remat {report['largest_batch_remat']})")
    return found


def settings_that_fit(config: TrainConfig, model_config, devices, refused: hbm.MemoryRefusal, *, images_per_row: int = 0) -> str:
    """For a run whose step the compiler refused on `devices`: the trainer flags fit's search finds that fit,
    with their figures (a few compiles), as the end of its one line."""
    report = fit(config, devices, vocab_size=model_config.num_embed, compare_precision=False, refused=refused,
                 images_per_row=images_per_row).report()
    found = fitting_settings(report, TRAINER_FLAGS)
    return ("the compiler fits " + ", or ".join(found)) if found else "the compiler fits no smaller batch, lean precision or accumulation of this run here"


def accumulation_that_fits(config: TrainConfig, model_config, devices, *, num_slices: int, usable: int,
                           largest: LargestBatch, images_per_row: int = 0) -> tuple[int, CompiledStep] | None:
    """For a run whose batch does not fit: the least --grad-accum-steps above its own whose micro-batches are no
    larger than the largest that fits (`largest`, searched) and divide over the chips, with its step compiled;
    None when there is none, or it does not fit (the gradient sums it adds can tip it over)."""
    micro_batch_fits = largest.batch // config.grad_accum_steps
    chips = len(devices)
    steps = next((steps for steps in range(config.grad_accum_steps + 1, config.batch_size // chips + 1)
                  if config.batch_size % (steps * chips) == 0 and config.batch_size // steps <= micro_batch_fits), None)
    if steps is None:
        return None
    result = _try_compile(dataclasses.replace(config, grad_accum_steps=steps), model_config, devices, num_slices,
                          why=f"the run's batch as {steps} micro-batches (it does not fit at once)", images_per_row=images_per_row)
    return (steps, result) if _fits(result, usable) else None


def _lean_savings(model_config, lean_precision: str) -> int:
    """The most bytes a chip can save by `lean_precision` over float32's state: every parameter's weight and
    AdamW moments (trainer.config.CHECKPOINT_BYTES_PER_TRAINED_PARAMETER) and its gradient (4 bytes -> 2), none
    of it sharded."""
    saved = CHECKPOINT_BYTES_PER_TRAINED_PARAMETER["float32"] - CHECKPOINT_BYTES_PER_TRAINED_PARAMETER[lean_precision] + 2
    return flops.param_count(model_config) * saved


def _mesh_name(sizes: dict[str, int]) -> str:
    return ",".join(f"{axis}={size}" for axis, size in sizes.items())


def split_meshes(chips_per_slice: int) -> list[dict[str, int]]:
    """Every FSDP group that divides a slice's chips, largest first, data parallelism over the rest:
    a smaller group moves less over ICI and holds more of the state per chip."""
    return [{"data": -1, "fsdp": size} for size in range(chips_per_slice, 0, -1) if chips_per_slice % size == 0]
