"""One training run, top to bottom: inputs, model, state (fresh or resumed), the step loop, export.

Read it in order: `train()` calls what it needs in the order a run needs it.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys

import jax

from trainer import export, run_identity, storage
from trainer.config import TrainConfig
from trainer.data import loader as data_lib
from trainer.errors import UserError
from trainer.loop.inputs import resolve_inputs
from trainer.loop.outputs import export_final, write_resolved_config
from trainer.loop.step_loop import StepLoop
from trainer.measure import compiled, flops
from trainer.measure.plot import plot_loss
from trainer.measure.run_events import EventLog
from trainer.measure.throughput import ThroughputMeter
from trainer.model import models, sampling
from trainer.multitier import replicated
from trainer.nn import precision
from trainer.run import checkpoint, compile_answers, hbm, local_checkpoints, mesh, step
from trainer.run import optimizer as optimizer_lib
from trainer.run.metrics import METRICS_FILE, MetricsReporter
from trainer.run.preemption import PreemptionNotice


def train(config: TrainConfig, *, started: float | None = None) -> dict:
    """Runs (or resumes) the training described by `config`; returns the final metrics. `started`: when
    this attempt began (the process's start, from the entry point), for its goodput events; else now."""
    storage.check_run_paths(config)
    with EventLog(started) as events:
        distributed = replicated.initialize_distributed(config)  # through GKE's multi-tier checkpointing volume, or not
        mesh.require_requested_platform()
        cache = compile_answers.use_persistent_cache(config.compilation_cache_dir) if config.compilation_cache_dir else None
        events.mark("init")
        preemption = PreemptionNotice(distributed)
        try:
            return _train(config, preemption, events)
        finally:
            preemption.close()
            if cache is not None and jax.process_index() == 0:
                print(f"trainer: {cache.line()}", file=sys.stderr, flush=True)


def _train(config: TrainConfig, preemption: PreemptionNotice, events: EventLog) -> dict:
    is_main = jax.process_index() == 0
    workdir = pathlib.Path(config.workdir)
    with storage.writing("--workdir", config.workdir):
        workdir.mkdir(parents=True, exist_ok=True)
    events.open(workdir, is_main=is_main, run=run_identity.record(workdir, dataclasses.asdict(config)) if is_main else None)
    if config.profile_port:
        jax.profiler.start_server(config.profile_port)

    with events.span("inputs"):  # goodput books these two spans as TRAINING_PREP; they say what it was
        inputs = resolve_inputs(config, workdir)
    model_config = models.model_config(config.model, vocab_size=inputs.tokenizer.vocab_size, images=bool(inputs.data.images))
    models.check_vocabulary(config.model, model_config, tokenizer_path=inputs.tokenizer_path, vocab_size=inputs.tokenizer.vocab_size)
    models.check_weights(config, model_config, tokenizer=inputs.tokenizer_path, vocab_size=inputs.tokenizer.vocab_size)
    export.check_base_export(config, model_config, what=f"--publish-parts {','.join(config.publish_parts)}: this run")
    compute_dtype = precision.compute_dtype(config.compute_dtype)
    device_mesh = mesh.build_mesh(config.mesh, slices=mesh.num_slices())
    mesh.check_batch(config.batch_size, device_mesh, grad_accum_steps=config.grad_accum_steps)
    total_steps = config.steps or config.epochs * data_lib.steps_per_epoch(
        inputs.data, seq_len=config.seq_len, global_batch_size=config.batch_size, eval_fraction=config.eval_fraction
    )
    run_step = step.build_run_step(config, model_config, device_mesh, total_steps=total_steps, compute_dtype=compute_dtype,
                                   images_per_row=inputs.data.images_per_row)
    optimizer = run_step.optimizer
    train_batches = data_lib.batches(
        inputs.data, seq_len=config.seq_len, global_batch_size=config.batch_size, seed=config.seed, split="train",
        eval_fraction=config.eval_fraction, epochs=None if config.steps else config.epochs,
        process_index=jax.process_index(), process_count=jax.process_count(),
    )
    checkpointer = checkpoint.Checkpointer(config.resolved_checkpoint_dir, keep=config.keep_checkpoints,
                                          beside_multi_tier=config.multi_tier_backup_minutes is not None)
    abstract = step.abstract_state(step.abstract_params(config, model_config)[0], optimizer, state_shardings_fn=run_step.shard)
    local = replicated.open_local_tier(config, abstract, device_mesh)  # None without --local-checkpoint-dir
    tiers = local_checkpoints.Tiers(checkpointer, local)
    resume_step = tiers.newest_step()

    with events.span("weights"):
        state, frozen = step.initial_state(config, model_config, run_step, resuming=resume_step is not None)
    if resume_step is None:
        start_step = 0
    else:
        with events.span("restore") as restored:
            resumed = tiers.restore(abstract, train_batches)
            start_step, state = resumed.step, resumed.state
            restored["step"] = start_step

    # Compiled ahead of its first call, so that --remat and --vocab-chunk auto can try the next candidate
    # when one does not fit, and --remat auto can take the fastest that fits.
    with events.span("compile"):
        try:
            run_step, lowered, compiled_train = compiled.compile_fastest(
                run_step, config, model_config, train_args=lambda candidate: (state, frozen, step.abstract_batch(candidate, config)))
        except hbm.MemoryRefusal as refused:
            print(f"trainer: {refused}; compiling smaller settings to name those that fit", file=sys.stderr, flush=True)
            raise UserError(f"{refused}; {compiled.settings_that_fit(config, model_config, list(device_mesh.devices.flat), refused, images_per_row=inputs.data.images_per_row)}") from None
    model, functions = run_step.model, dataclasses.replace(run_step.functions, train=compiled_train)
    positions_per_step = config.batch_size * config.seq_len
    footprint = hbm.before_first_step(compiled_train, state, frozen)  # None where the device does not say
    hbm.check_before_first_step(footprint, config)
    if is_main:
        write_resolved_config(config, workdir, model_config=model_config, inputs=inputs, total_steps=total_steps,
                              mesh_shape=dict(device_mesh.shape), compute_dtype=compute_dtype, run_step=run_step,
                              step_fingerprint=step.step_fingerprint(lowered), footprint=footprint)

    with MetricsReporter(workdir, total_steps=total_steps, tensorboard_dir=config.resolved_tensorboard_dir,
                         is_main_process=is_main, start_step=start_step + 1, stream=sys.stdout,
                         log_format=config.log_format) as reporter:
        if footprint is not None:
            reporter.text("memory", start_step, footprint.line())
        if run_step.remat_speeds:
            reporter.text("remat", start_step, f"--remat auto took {step.speed_words(run_step.remat_speeds)}")
        if resume_step is not None:
            done = f"; it completes the {total_steps} steps, nothing left to train" if start_step >= total_steps else ""
            reporter.text("run", start_step, f"resuming from the checkpoint of step {start_step} in {resumed.directory} "
                                             f"({resumed.tier} tier){done}")
        forward_params = lambda state: step.forward_params(state["params"], frozen, compute_dtype)  # noqa: E731
        sample = lambda state: sampling.sample_text(model, forward_params(state), inputs.tokenizer,  # noqa: E731
                                                    chat_template=inputs.data.is_chat)
        if config.samples:
            with events.span("eval"):
                reporter.text("samples/before", start_step, sample(state))
        images = dict(images_per_row=inputs.data.images_per_row, train_encoder=config.vision_encoder == "trained")
        loop = StepLoop(
            config=config, total_steps=total_steps, mesh=device_mesh, functions=functions, frozen=frozen,
            checkpointer=checkpointer, reporter=reporter, schedule=optimizer_lib.learning_rate_schedule(run_step.optimizer_config), inputs=inputs,
            throughput=ThroughputMeter(
                positions_per_step=positions_per_step,
                flops_per_token=flops.training_flops_per_token(model_config, config.seq_len, lora_rank=config.lora_rank,
                                                               **images),
                model_config=model_config, lora_rank=config.lora_rank,
                image_flops_per_token=flops.image_flops_per_token(model_config, config.seq_len, **images),
            ),
            preemption=preemption, events=events, local_checkpoints=local,
        )
        events.mark("ready", start_step=start_step)
        try:
            state, final_metrics = loop.run(state, train_batches, start_step)
        finally:
            with events.span("save"):  # the last saves, asynchronous until now
                checkpointer.close()
                if local is not None:
                    local.close()
        if config.samples:
            with events.span("eval"):
                reporter.text("samples/after", total_steps, sample(state))
    with events.span("export"):
        export_final(workdir, state, frozen, config=config, model_config=model_config, tokenizer=inputs.tokenizer)
        if is_main:
            try:
                plot_loss(workdir / METRICS_FILE, workdir / "loss.png")
            except UserError as error:  # a nicety: the run's weights are exported and published by now
                checkpoint.print_warning(f"the loss plot was not drawn: {error}")
    return final_metrics
