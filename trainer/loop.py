"""One training run, top to bottom: inputs, model, state (fresh or resumed), the step loop, export.

Read it in order: `train()` calls the helpers below it in the order a run needs them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import pathlib
import sys
import time

import jax
import jax.numpy as jnp

from trainer import run_identity, shared_files, storage
from trainer.model import models, sampling
from trainer.nn import precision
from trainer.run import checkpoint, compile_answers, hbm, local_checkpoints, mesh, step
from trainer.run import optimizer as optimizer_lib
from trainer import export
from trainer.hf import publish
from trainer.multitier import replicated

from trainer.measure import compiled, flops, goodput_accounting, step_profile
from trainer.data import loader as data_lib
from trainer.data import tokenizer as tokenizer_lib
from trainer.config import TrainConfig
from trainer.data.chat_corpus import write_chat_corpus
from trainer.data.corpus import write_corpus
from trainer.errors import UserError
from trainer.run.metrics import METRICS_FILE, MetricsReporter
from trainer.measure.plot import plot_loss
from trainer.run.preemption import PreemptionNotice
from trainer.measure.run_events import EventLog
from trainer.measure.throughput import ThroughputMeter

# The demo's generated inputs (`--preset tiny` or `tiny-chat` without --data / --tokenizer).
DEMO_STORIES = 4000
DEMO_CONVERSATIONS = 4000
DEMO_VOCAB_SIZE = 512
# Steps after the first of a run whose profile `--profile-dir` captures (past compilation).
PROFILE_STEPS = range(3, 6)


class Preempted(Exception):
    """Raised after the preemption checkpoint; the entry point exits with contract.RETRY."""

    def __init__(self, step: int):
        super().__init__(f"preempted: checkpointed step {step}, restart to resume")
        self.step = step


@dataclasses.dataclass(frozen=True)
class Inputs:
    data: object  # trainer.data.loader.TokenizedData
    tokenizer: object  # trainer.data.tokenizer.Tokenizer
    data_source: str
    tokenizer_path: str


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

    inputs = resolve_inputs(config, workdir)
    model_config = models.model_config(config.model, vocab_size=inputs.tokenizer.vocab_size)
    models.check_vocabulary(config.model, model_config, tokenizer_path=inputs.tokenizer_path, vocab_size=inputs.tokenizer.vocab_size)
    models.check_weights(config, model_config, tokenizer=inputs.tokenizer_path, vocab_size=inputs.tokenizer.vocab_size)
    compute_dtype = precision.compute_dtype(config.compute_dtype)
    device_mesh = mesh.build_mesh(config.mesh, slices=mesh.num_slices())
    mesh.check_batch(config.batch_size, device_mesh, grad_accum_steps=config.grad_accum_steps)
    total_steps = config.steps or config.epochs * data_lib.steps_per_epoch(
        inputs.data, seq_len=config.seq_len, global_batch_size=config.batch_size, eval_fraction=config.eval_fraction
    )
    run_step = step.build_run_step(config, model_config, device_mesh, total_steps=total_steps, compute_dtype=compute_dtype)
    optimizer = run_step.optimizer
    train_batches = data_lib.batches(
        inputs.data, seq_len=config.seq_len, global_batch_size=config.batch_size, seed=config.seed, split="train",
        eval_fraction=config.eval_fraction, epochs=None if config.steps else config.epochs,
        process_index=jax.process_index(), process_count=jax.process_count(),
    )
    checkpointer = checkpoint.Checkpointer(config.resolved_checkpoint_dir, keep=config.keep_checkpoints)
    abstract = step.abstract_state(step.abstract_params(config, model_config)[0], optimizer, state_shardings_fn=run_step.shard)
    local = replicated.open_local_tier(config, abstract, device_mesh)  # None without --local-checkpoint-dir
    tiers = local_checkpoints.Tiers(checkpointer, local)
    resume_step = tiers.newest_step()

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
            raise UserError(f"{refused}; {compiled.settings_that_fit(config, model_config, list(device_mesh.devices.flat), refused)}") from None
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
        loop = _StepLoop(
            config=config, total_steps=total_steps, mesh=device_mesh, functions=functions, frozen=frozen,
            checkpointer=checkpointer, reporter=reporter, schedule=optimizer_lib.learning_rate_schedule(run_step.optimizer_config), inputs=inputs,
            throughput=ThroughputMeter(
                positions_per_step=positions_per_step,
                flops_per_token=flops.training_flops_per_token(model_config, config.seq_len, lora_rank=config.lora_rank),
                model_config=model_config, lora_rank=config.lora_rank,
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


def resolve_inputs(config: TrainConfig, workdir: pathlib.Path) -> Inputs:
    """The tokenizer and the opened data; `--preset tiny` (stories) and `tiny-chat` (conversations)
    generate what they are not given. A tokenizer trained here for chat data has the turn markers.

    What is generated or prepared in the workdir is made by process 0 while the others wait
    (mesh.process_zero_first): a multi-host slice shares one workdir.
    """
    generated = workdir / "data"
    chat_demo = config.preset == "tiny-chat"
    # No --data only with --preset (parse_config).
    data_source = config.data or str(generated / ("chat.jsonl" if chat_demo else "corpus.txt"))
    tokenizer_path = config.tokenizer
    if tokenizer_path is None:
        tokenizer_path = str(generated / "tokenizer.model") if config.model == models.TINY else tokenizer_lib.OFFICIAL_TOKENIZER

    def make_and_open():
        if config.data is None and not pathlib.Path(data_source).exists():
            if chat_demo:
                write_chat_corpus(data_source, num_conversations=DEMO_CONVERSATIONS, seed=config.seed)
            else:
                write_corpus(data_source, num_stories=DEMO_STORIES, seed=config.seed)
        if config.tokenizer is None and config.model == models.TINY and not pathlib.Path(tokenizer_path).exists():
            tokenizer_lib.train_tokenizer(data_source, tokenizer_path, vocab_size=DEMO_VOCAB_SIZE, seed=config.seed,
                                          data_format=config.data_format)
        tokenizer = tokenizer_lib.load_tokenizer(tokenizer_path)  # the run's one load: everything after gets it
        return tokenizer, data_lib.open_data(data_source, tokenizer=tokenizer, cache_dir=str(workdir / "data_cache"),
                                             data_format=config.data_format, loss_on=config.loss_on,
                                             on_bad_row=config.on_bad_row)

    tokenizer, data = mesh.process_zero_first(f"the inputs in {workdir}", make_and_open)
    return Inputs(data=data, tokenizer=tokenizer, data_source=data_source, tokenizer_path=tokenizer_path)


def describe_data(inputs: Inputs) -> str:
    """The data line a run starts with: what was read as what, and what was left out."""
    data = inputs.data
    skipped = data.skipped_rows
    line = (f"{inputs.data_source}: {data.data_format}, {data.documents} documents, {data.tokens} tokens, "
            f"loss on {data.loss_on}")
    if skipped:
        line += f"; skipped {sum(skipped.values())} bad rows (" + ", ".join(f"{r} {n}" for r, n in skipped.items()) + ")"
    return line


def batch_digest(local_batch: dict) -> str:
    """A short digest of a batch's rows (this process's share): equal digests in two runs' metrics
    mean the step trained on the same data, e.g. after a resume."""
    digest = hashlib.sha256()
    for key in sorted(local_batch):
        digest.update(key.encode() + local_batch[key].tobytes())
    return digest.hexdigest()[:12]


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


@dataclasses.dataclass
class _StepLoop:
    config: TrainConfig
    total_steps: int
    mesh: object
    functions: step.StepFunctions
    frozen: object
    checkpointer: checkpoint.Checkpointer
    reporter: object
    schedule: object
    inputs: Inputs
    throughput: ThroughputMeter
    preemption: PreemptionNotice
    events: EventLog
    local_checkpoints: local_checkpoints.LocalCheckpoints | None = None  # the fast tier, saved on its own interval
    last_good_checkpoint: int | None = None
    data_stated: bool = False
    _profile_started: float = 0.0

    def run(self, state, train_batches, start_step: int):
        config = self.config
        self.last_good_checkpoint = start_step or None
        final = {}
        for step_number in range(start_step + 1, self.total_steps + 1):
            waited = time.time()
            try:
                local_batch = next(train_batches)
            except StopIteration:
                break
            began = time.time()
            self._profile(step_number - start_step, before=True)
            state, metrics = self.functions.train(state, self.frozen, mesh.global_batch(local_batch, self.mesh))
            self._profile(step_number - start_step, before=False, metrics=metrics)
            self.throughput.add(metrics, local_batch["segment_ids"])
            local_due = self.local_checkpoints is not None and self.local_checkpoints.due(step_number)
            last = step_number == self.total_steps
            # The first step of every run is reported too, so a resumed run shows where it started.
            due_log = step_number % config.log_interval == 0 or last or step_number == start_step + 1
            due_eval = config.eval_fraction > 0 and (step_number % config.eval_interval == 0 or last)
            due_checkpoint = step_number % config.checkpoint_interval == 0 or last
            preempted = self.preemption.reached(step_number)
            due = due_log or due_eval or due_checkpoint or preempted
            # The host runs ahead of the chips: a step's time is known where the loop waits for its metrics.
            values = {key: float(value) for key, value in jax.device_get(metrics).items()} if due or local_due else None
            self.events.step(step_number, waited=waited, began=began)
            if local_due:
                with self.events.span("save", step=step_number, tier="local"):
                    self.local_checkpoints.after_step(step_number, state, train_batches, values)
            if not due:
                continue
            self._check_finite(step_number, values)
            report = {}
            if due_log:
                report = {"loss": values["loss"], "learning_rate": float(self.schedule(step_number - 1)), "grad_norm": values["grad_norm"]}
                report["batch"] = batch_digest(local_batch)
                report.update(self.throughput.measure())
                final = {"step": step_number, **report}
                self.events.flush()
                if attempts := self.events.attempts():
                    report.update(goodput_accounting.account(attempts).report())
            if due_eval:
                with self.events.span("eval"):
                    report.update(self._evaluate(state))
            if report:
                if not self.data_stated:
                    # With the first report, not before step 1: a run that fails there prints nothing on stdout.
                    self.reporter.text("data", step_number, describe_data(self.inputs))
                    self.data_stated = True
                self.reporter.report(step_number, report)
            if due_checkpoint or preempted:
                with self.events.span("save", step=step_number):
                    self.checkpointer.save(step_number, state, train_batches)
                self.last_good_checkpoint = step_number
            if preempted and not last:
                with self.events.span("save"):
                    self.checkpointer.close()
                    if self.local_checkpoints is not None:
                        self.local_checkpoints.close()
                raise Preempted(step_number)
            self.throughput.restart()  # eval and checkpoint time is not step time
        return state, final

    def _evaluate(self, state) -> dict:
        config = self.config
        eval_batches = data_lib.batches(
            self.inputs.data, seq_len=config.seq_len, global_batch_size=config.batch_size, seed=config.seed, split="eval",
            eval_fraction=config.eval_fraction, epochs=1, process_index=jax.process_index(),
            process_count=jax.process_count(), prefetch=False,
        )
        total, count = 0.0, 0.0
        for local_batch in eval_batches:
            batch_total, batch_count = self.functions.evaluate(state, self.frozen, mesh.global_batch(local_batch, self.mesh))
            total, count = total + float(batch_total), count + float(batch_count)
        if count == 0:
            return {}
        eval_loss = total / count
        return {"eval_loss": eval_loss, "eval_perplexity": math.exp(min(eval_loss, 700.0))}

    def _check_finite(self, step_number: int, values: dict) -> None:
        if not (math.isfinite(values["loss"]) and math.isfinite(values["grad_norm"])):
            kept = (
                f"the last good checkpoint is step {self.last_good_checkpoint} in {self.checkpointer.directory}"
                if self.last_good_checkpoint
                else "no checkpoint was written"
            )
            raise UserError(
                f"training diverged: loss {values['loss']}, gradient norm {values['grad_norm']} at step {step_number}; "
                f"{kept}; lower --lr or raise --warmup-steps"
            )

    def _profile(self, run_step: int, *, before: bool, metrics=None) -> None:
        """Traces PROFILE_STEPS of this run into --profile-dir, then prints where their time went
        (trainer.measure.step_profile) and leaves the step's HLO beside the trace as step.hlo."""
        if not self.config.profile_dir:
            return
        if before and run_step == PROFILE_STEPS.start:
            jax.profiler.start_trace(self.config.profile_dir)
            self._profile_started = time.perf_counter()
        elif not before and run_step == PROFILE_STEPS[-1]:
            jax.block_until_ready(metrics)
            jax.profiler.stop_trace()
            step_s = (time.perf_counter() - self._profile_started) / len(PROFILE_STEPS)
            if "://" in self.config.profile_dir:
                self.reporter.text("profile", run_step, "the trace is in --profile-dir; the table of where its time "
                                   "went is printed for a local --profile-dir only")
                return
            hlo = self.functions.train.as_text()
            if jax.process_index() == 0:
                with shared_files.replaced_atomically(pathlib.Path(self.config.profile_dir) / "step.hlo") as temporary:
                    temporary.write_text(hlo)
            rows = step_profile.profile_table(self.config.profile_dir, hlo, steps=len(PROFILE_STEPS), step_s=step_s)
            self.reporter.text("profile", run_step, step_profile.format_table(
                rows, title=f"where the time of steps {PROFILE_STEPS.start}-{PROFILE_STEPS[-1]} went ({step_s * 1e3:.1f} ms a step)"))


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
    if frozen is not None:
        checkpoint.export_params(state["params"], export_dir / "lora")
    base = jax.tree.map(lambda p: p.astype(jnp.float32), frozen)
    merged = models.merge_lora_into_base(step.model_params(state["params"], base))
    checkpoint.export_params(merged, export_dir / "params")
    writers = {
        "hf": lambda folder, write: export.write_model(folder, model_config, merged, tokenizer, dtype="bfloat16", write=write),
        "base": lambda folder, write: export.write_model(folder, model_config, frozen, tokenizer, dtype="bfloat16", write=write),
        "adapter": lambda folder, write: export.write_adapter(folder, model_config, state["params"], rank=config.lora_rank,
                                                              base_model=export.adapter_base_model(config), dtype="bfloat16",
                                                              write=write),
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
