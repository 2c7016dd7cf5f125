"""The step loop: a batch, the step, its report, evaluation, checkpoints (both tiers), preemption and the profile."""

from __future__ import annotations

import dataclasses
import math
import pathlib
import time

import jax

from trainer import shared_files
from trainer.config import TrainConfig
from trainer.data import loader as data_lib
from trainer.errors import UserError
from trainer.loop.inputs import Inputs, batch_digest, describe_data
from trainer.measure import goodput_accounting, step_profile
from trainer.measure.run_events import EventLog
from trainer.measure.throughput import ThroughputMeter
from trainer.run import checkpoint, local_checkpoints, mesh, step
from trainer.run.preemption import PreemptionNotice


# Steps after the first of a run whose profile `--profile-dir` captures (past compilation).
PROFILE_STEPS = range(3, 6)


class Preempted(Exception):
    """Raised after the preemption checkpoint; the entry point exits with contract.RETRY."""

    def __init__(self, step: int):
        super().__init__(f"preempted: checkpointed step {step}, restart to resume")
        self.step = step


@dataclasses.dataclass
class StepLoop:
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
