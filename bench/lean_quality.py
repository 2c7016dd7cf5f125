"""The lean precision's quality against float32's, on this machine's first device: `python -m bench.lean_quality`.

Two full fine-tunes of the same model from the same random weights on the same batches (the benchmark's
generated corpus, bench.inputs), one with float32 weights and AdamW state, one with `--precision lean`
(bfloat16, each update rounded stochastically), at the trainer's default learning rate (2e-5, constant),
where round-to-nearest bfloat16 would lose most updates. Prints both losses every 10 steps and the
ratio of the mean loss over the last 10 steps, lean / float32; the figures go to --out as JSON.
`--dry-run`: the tiny model on the CPU, in seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import jax

from bench import inputs as inputs_lib
from bench.ours import Ours
from trainer import config as config_lib
from trainer.measure.compiled import LEAN_PRECISIONS
from trainer.model import models
from trainer.run.mesh import jax_entry_point
from trainer.shared_files import replaced_atomically

WINDOW = 10  # steps whose mean loss is compared


def losses(model_config, data, *, precision: str, steps: int, seq_len: int, batch: int, step_options: dict) -> list[float]:
    side = Ours(model_config, data, seq_len=seq_len, batch_size=batch, state_precision=precision, **step_options)
    side.compile()
    found = []
    for _ in range(steps):
        side.step()
        found.append(float(side.last_output()["loss"]))  # waits for each step: quality, not speed
    side.close()
    return found


@jax_entry_point("bench.lean_quality: ")
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lean_quality", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--precision", choices=LEAN_PRECISIONS, default="lean", help="the lean setting compared with float32")
    parser.add_argument("--remat", choices=config_lib.REMATS, default="auto", help="--remat of both runs (auto: the trainer's choice)")
    parser.add_argument("--vocab-chunk", type=config_lib.vocab_chunk_option, default="auto", help="--vocab-chunk of both runs")
    parser.add_argument("--out", help="JSON file for the figures")
    parser.add_argument("--workdir", default=inputs_lib.DEFAULT_WORKDIR, help="where the generated inputs are cached")
    parser.add_argument("--dry-run", action="store_true", help="the tiny model on the CPU, 20 steps of 4 x 64")
    args = parser.parse_args(argv)
    if args.dry_run:
        jax.config.update("jax_platforms", "cpu")
        args.model, args.steps, args.seq_len, args.batch = "tiny", 20, 64, 4
    inputs = inputs_lib.build_inputs(args.workdir)
    model_config = models.model_config(args.model, vocab_size=inputs.tokenizer.vocab_size)
    lean, step_options = args.precision, {"remat": args.remat, "vocab_chunk": args.vocab_chunk}
    curves = {precision: losses(model_config, inputs.data, precision=precision, steps=args.steps, seq_len=args.seq_len,
                                batch=args.batch, step_options=step_options) for precision in ("float32", lean)}
    for step in range(9, args.steps, 10):
        print(f"step {step + 1:4d}: float32 {curves['float32'][step]:.4f}  {lean} {curves[lean][step]:.4f}")
    window = min(WINDOW, args.steps)
    means = {precision: statistics.fmean(curve[-window:]) for precision, curve in curves.items()}
    ratio = means[lean] / means["float32"]
    print(f"{args.model}, {args.steps} steps of {args.batch} x {args.seq_len} on {jax.devices()[0].device_kind}: mean loss of the "
          f"last {window} steps, float32 {means['float32']:.4f}, {lean} {means[lean]:.4f}: {lean} / float32 = {ratio:.4f}")
    if args.out:
        with replaced_atomically(args.out) as temporary:
            temporary.write_text(json.dumps({"model": args.model, "steps": args.steps, "seq_len": args.seq_len, "batch": args.batch,
                                             "device_kind": jax.devices()[0].device_kind, "losses": curves,
                                             "mean_last": means, "precision": lean, "lean_over_float32": ratio}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
