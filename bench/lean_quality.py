"""The lean precisions' quality against float32's, fine-tuning from a trained start: `python -m bench.lean_quality`.

The method (tests/trainer/test_lean_precision.py runs it on the tiny model as the test suite's guard):

1. The trained start: float32 trains the model from random weights for `pretrain_steps` (warmup, then cosine
   decay from `pretrain_lr`) on the train split; its weights are rounded to bfloat16, as Gemma's released
   weights are, so that every precision starts from the same values.
2. From that start, float32 and each lean precision fine-tune `steps` steps at `lr` (constant), once per seed:
   the seed orders the fine-tune's batches (both precisions of a seed see the same batches; the rounding's own
   seed stays 0, so that each precision compiles once).
3. The held-out loss (the eval split, never trained on) of the start and of each fine-tune. A precision's gain
   on a seed is the start's loss minus its own; the guard: its share of float32's gain on the same seed's
   batches is at least KEEPS (0.9) on every seed. Pairing by seed takes the batches' luck out: float32's own
   gain moves by 16% between seeds on the tiny model, the share by 0.012-0.015.

At the fine-tune's rate many of Adam's steps (the rate times |m| / sqrt(v), often well below the rate) are under
half of bfloat16's spacing at their weight, so round-to-nearest bfloat16 (which drops them) keeps 0.59-0.68 of
float32's gain on the tiny model and fails. Prints every figure and the verdict; --out writes them as JSON.
`--dry-run`: the tiny model on the CPU, a few steps (about 25 s; it checks the plumbing, its figures are too short
to mean much).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time

import jax
import jax.numpy as jnp

from bench import inputs as inputs_lib
from trainer import config as config_lib
from trainer.data import loader as data_lib
from trainer.measure import compiled as compiled_lib
from trainer.measure.compiled import LEAN_PRECISIONS
from trainer.model import models
from trainer.nn import precision as precision_lib
from trainer.run import mesh, step
from trainer.run.mesh import jax_entry_point
from trainer.shared_files import replaced_atomically

KEEPS = 0.9  # the least share of float32's held-out gain a lean precision keeps, on every seed


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """What one comparison trains: sizes, steps, rates and seeds (the module docstring's method)."""

    seq_len: int
    batch: int
    pretrain_steps: int
    pretrain_lr: float
    steps: int  # of each fine-tune
    lr: float  # the fine-tunes' constant rate
    seeds: int
    keeps: float = KEEPS
    eval_fraction: float = 0.05
    remat: str = "auto"
    vocab_chunk: str = "auto"


# The test suite's guard (tiny model, CPU): about 40 s on 2 cores.
TINY = Plan(seq_len=64, batch=8, pretrain_steps=100, pretrain_lr=3e-3, steps=20, lr=1e-4, seeds=3)
DRY_RUN = dataclasses.replace(TINY, batch=4, pretrain_steps=20, steps=4, seeds=2, eval_fraction=0.01)
# The chip's default: gemma3-270m; the fine-tune at the trainer's default rate.
CHIP = Plan(seq_len=1024, batch=8, pretrain_steps=300, pretrain_lr=1e-3, steps=50, lr=2e-5, seeds=3)


class _Run:
    """One precision's train step, built and compiled as the trainer's (trainer.run.step), over one model."""

    def __init__(self, model: str, model_config, data, device_mesh, plan: Plan, *, precision: str, lr: float, schedule: str,
                 warmup: int, steps: int):
        self.config = config_lib.TrainConfig(model=model, weights="random", seq_len=plan.seq_len, batch_size=plan.batch, lr=lr,
                                             lr_schedule=schedule, warmup_steps=warmup, precision=precision, remat=plan.remat,
                                             vocab_chunk=plan.vocab_chunk, eval_fraction=plan.eval_fraction)
        self.model_config, self.data, self.mesh = model_config, data, device_mesh
        self.run_step = step.build_run_step(self.config, model_config, device_mesh, total_steps=steps,
                                            compute_dtype=precision_lib.compute_dtype())
        build = functools.partial(step.fresh_state, optimizer=self.run_step.optimizer)
        params = step.abstract_params(self.config, model_config)[0]
        # step.init_state's program, compiled once for all the seeds (init_state compiles it at each call).
        self.fresh = jax.jit(build, out_shardings=self.run_step.shard(jax.eval_shape(build, params)), donate_argnums=0)
        self.compiled = None

    def state(self, params=None):
        """The state before step 1 from `params` (float32, donated), or from the seed-0 random weights."""
        if params is None:
            state, _ = step.initial_state(self.config, self.model_config, self.run_step, resuming=False)
        else:
            state = self.fresh(params)
            for leaf in jax.tree.leaves(params):  # what the state could not take over (lean's are bfloat16), as init_state does
                if not leaf.is_deleted():
                    leaf.delete()
        if self.compiled is None:
            self.run_step, _, self.compiled = compiled_lib.compile_fastest(
                self.run_step, self.config, self.model_config,
                train_args=lambda candidate: (state, None, step.abstract_batch(candidate, self.config)))
        return state

    def train(self, state, plan: Plan, *, steps: int, seed: int):
        batches = data_lib.batches(self.data, seq_len=plan.seq_len, global_batch_size=plan.batch, seed=seed, split="train",
                                   eval_fraction=plan.eval_fraction, prefetch=False)
        for _ in range(steps):
            state, metrics = self.compiled(state, None, mesh.global_batch(next(batches), self.mesh))
        return state, float(metrics["loss"])

    def held_out(self, params, eval_batches) -> float:
        """The mean loss of float32 `params` (any precision's, cast: exact) over the held-out batches."""
        total = count = 0.0
        for batch in eval_batches:
            batch_total, batch_count = self.run_step.functions.evaluate({"params": params}, None, batch)
            total, count = total + float(batch_total), count + float(batch_count)
        return total / count


def compare(model: str, data: data_lib.TokenizedData, plan: Plan, *, precisions=LEAN_PRECISIONS, say=print) -> dict:
    """The method's figures for --model `model` on `data`: the start's held-out loss, each precision's per seed,
    their shares of float32's gain and the verdict; `say` prints the progress and figures."""
    model_config = models.model_config(model, vocab_size=data.vocab_size)
    device_mesh = mesh.build_mesh({"data": -1, "fsdp": 1})
    eval_batches = [mesh.global_batch(batch, device_mesh) for batch in data_lib.batches(
        data, seq_len=plan.seq_len, global_batch_size=plan.batch, seed=0, split="eval", eval_fraction=plan.eval_fraction,
        epochs=1, prefetch=False)]
    if not eval_batches:
        raise ValueError(f"no held-out batch of {plan.batch} x {plan.seq_len} at eval fraction {plan.eval_fraction}")

    def run(precision: str, **options) -> _Run:
        return _Run(model, model_config, data, device_mesh, plan, precision=precision, **options)

    began = time.perf_counter()
    pretrain = run("float32", lr=plan.pretrain_lr, schedule="cosine", warmup=max(plan.pretrain_steps // 10, 1), steps=plan.pretrain_steps)
    state, train_loss = pretrain.train(pretrain.state(), plan, steps=plan.pretrain_steps, seed=0)
    start = jax.tree.map(lambda p: p.astype(jnp.bfloat16), state["params"])
    del state
    fine_tunes = {precision: run(precision, lr=plan.lr, schedule="constant", warmup=0, steps=plan.steps)
                  for precision in ("float32", *precisions)}
    float32 = lambda params: jax.tree.map(lambda p: p.astype(jnp.float32), params)  # noqa: E731 (a copy: bfloat16's)
    start_loss = pretrain.held_out(float32(start), eval_batches)
    say(f"trained start: float32, {plan.pretrain_steps} steps of {plan.batch} x {plan.seq_len} at lr {plan.pretrain_lr:g} "
        f"(train loss {train_loss:.4f}), rounded to bfloat16: held-out loss {start_loss:.4f} ({time.perf_counter() - began:.0f} s)")
    held_out = {precision: [] for precision in fine_tunes}
    for seed in range(1, plan.seeds + 1):
        for precision, fine_tune in fine_tunes.items():
            state, _ = fine_tune.train(fine_tune.state(float32(start)), plan, steps=plan.steps, seed=seed)
            held_out[precision].append(pretrain.held_out(float32(state["params"]), eval_batches))
        say(f"seed {seed}: {plan.steps} fine-tune steps at lr {plan.lr:g}, held-out loss "
            + ", ".join(f"{precision} {losses[-1]:.4f}" for precision, losses in held_out.items())
            + f" ({time.perf_counter() - began:.0f} s)")
    float32_gains = [start_loss - loss for loss in held_out["float32"]]
    # Where float32 gains nothing there is nothing to keep a share of: no share (NaN), and the verdict fails.
    shares = {precision: [(start_loss - loss) / gain if gain > 0 else float("nan")
                          for loss, gain in zip(held_out[precision], float32_gains)] for precision in precisions}
    passed = {precision: min(share) >= plan.keeps and min(float32_gains) > 0 for precision, share in shares.items()}
    say(f"float32's gain over the start: {', '.join(f'{gain:.4f}' for gain in float32_gains)} "
        + (f"(spread {(max(float32_gains) - min(float32_gains)) / max(float32_gains):.1%} of the largest)" if min(float32_gains) > 0
           else "(none on some seed: no verdict to give but fail; a longer fine-tune or a higher --lr)"))
    for precision, share in shares.items():
        say(f"{precision}: share of float32's gain {', '.join(f'{value:.4f}' for value in share)} "
            f"(spread {max(share) - min(share):.4f}); at least {plan.keeps} on every seed: {'pass' if passed[precision] else 'FAIL'}")
    verdict = "pass" if all(passed.values()) else "fail"
    say(f"verdict: {verdict} ({time.perf_counter() - began:.0f} s)")
    return {"plan": dataclasses.asdict(plan), "device_kind": jax.devices()[0].device_kind,
            "compute_dtype": jnp.dtype(precision_lib.compute_dtype()).name, "pretrain_train_loss": train_loss,
            "start_held_out_loss": start_loss, "held_out_loss": held_out, "float32_gain": float32_gains,
            "gain_share": shares, "passed": passed, "verdict": verdict, "seconds": time.perf_counter() - began}


@jax_entry_point("bench.lean_quality: ")
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lean_quality", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--precision", choices=(*LEAN_PRECISIONS, "both"), default="both", help="the lean setting(s) compared with float32")
    parser.add_argument("--pretrain-steps", type=int, default=CHIP.pretrain_steps,
                        help="float32 steps from random weights to the trained start")
    parser.add_argument("--pretrain-lr", type=float, default=CHIP.pretrain_lr)
    parser.add_argument("--steps", type=int, default=CHIP.steps, help="steps of each fine-tune")
    parser.add_argument("--lr", type=float, default=CHIP.lr, help="the fine-tunes' constant rate")
    parser.add_argument("--seeds", type=int, default=CHIP.seeds, help="fine-tunes of each precision (batch orders)")
    parser.add_argument("--seq-len", type=int, default=CHIP.seq_len)
    parser.add_argument("--batch", type=int, default=CHIP.batch)
    parser.add_argument("--keeps", type=float, default=KEEPS, help="the least share of float32's held-out gain that passes")
    parser.add_argument("--remat", choices=config_lib.REMATS, default="auto", help="--remat of every run (auto: the trainer's choice)")
    parser.add_argument("--vocab-chunk", type=config_lib.vocab_chunk_option, default="auto", help="--vocab-chunk of every run")
    parser.add_argument("--out", help="JSON file for the figures")
    parser.add_argument("--workdir", default=inputs_lib.DEFAULT_WORKDIR, help="where the generated inputs are cached")
    parser.add_argument("--dry-run", action="store_true",
                        help=f"the tiny model on the CPU: {DRY_RUN.pretrain_steps} steps to the start, {DRY_RUN.seeds} fine-tunes of "
                             f"{DRY_RUN.steps} steps each, {DRY_RUN.batch} x {DRY_RUN.seq_len}")
    args = parser.parse_args(argv)
    if args.dry_run:
        jax.config.update("jax_platforms", "cpu")
        args.model, plan = "tiny", dataclasses.replace(DRY_RUN, keeps=args.keeps)
    else:
        plan = Plan(seq_len=args.seq_len, batch=args.batch, pretrain_steps=args.pretrain_steps, pretrain_lr=args.pretrain_lr,
                    steps=args.steps, lr=args.lr, seeds=args.seeds, keeps=args.keeps, remat=args.remat, vocab_chunk=args.vocab_chunk)
    precisions = LEAN_PRECISIONS if args.precision == "both" else (args.precision,)
    inputs = inputs_lib.build_inputs(args.workdir)
    print(f"{args.model} on {jax.devices()[0].device_kind}: {', '.join(precisions)} against float32 from a trained start")
    figures = {"model": args.model, **compare(args.model, inputs.data, plan, precisions=precisions)}
    if args.out:
        with replaced_atomically(args.out) as temporary:
            temporary.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
