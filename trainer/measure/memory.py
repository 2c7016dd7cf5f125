"""Per-chip memory estimate for a Gemma fine-tune, and the README's table: `python -m trainer.measure.memory`.

The formula (bytes on one chip; N = model parameters, A = LoRA adapter parameters, fsdp = the
number of chips the state is sharded over):

- weights: full fine-tune, float32 master weights, sharded: 4N / fsdp. LoRA: the frozen base is
  held in bfloat16 only (the trainer casts it once; it is also the compute copy): 2N / fsdp.
- gradients and AdamW state (mu, nu), float32, sharded: full fine-tune 12N / fsdp. LoRA trains
  the adapters only: their float32 weights, gradients, mu and nu, 16A, kept whole (they are small).
- compute copy: full fine-tune, the bfloat16 cast of the masters, 2N / fsdp; LoRA, of the
  adapters, 2A. Under FSDP also the weights all-gathered for the layer being computed: the
  embedding or one block, whichever is larger, at 2 bytes each.
- activations saved for the backward pass, bfloat16, without rematerialisation, per token and
  layer: the block's inputs and outputs (10 x embed_dim), q, k, v and the attention output
  (2 x heads x head_dim + 2 x kv_heads x head_dim), the feed-forward's gate, up, activation and
  product (4 x hidden_dim), and the attention logits and probabilities (2 x heads x seq_len).
  Times layers x batch_per_chip x seq_len. The loss is assumed computed in vocabulary chunks.

It is the steady state of the step loop: loading LoRA's base briefly holds it in float32 too
(before any activation exists). It leaves out XLA's temporary buffers and fragmentation, and XLA's
fusions often save some of the activations counted here, so read "fits" as "plausible" and keep a
margin.
"""

import argparse
import dataclasses
import math
import sys

from trainer.errors import UserError
from trainer.measure import flops
from trainer.run import hardware
from trainer.run.mesh import jax_entry_point

_BF16 = 2
_F32 = 4
_GIB = 2**30


def _activation_bytes_per_token(config, seq_len: int) -> int:
    values = (
        10 * config.embed_dim
        + 2 * config.num_heads * config.head_dim
        + 2 * config.num_kv_heads * config.head_dim
        + 4 * config.hidden_dim
        + 2 * config.num_heads * seq_len
    )
    return config.num_layers * values * _BF16


def estimate_bytes_per_chip(config, *, chips: int, fsdp: int, lora_rank: int, batch_per_chip: int, seq_len: int) -> dict:
    """The formula of this module's docstring, each term in bytes, plus their `total`.

    `chips` is the number of chips holding one copy of the state (it bounds `fsdp`)."""
    if not 1 <= fsdp <= chips:
        raise ValueError(f"fsdp must be between 1 and chips ({chips}), got {fsdp}")
    params = flops.param_count(config)
    adapters = flops.lora_param_count(config, lora_rank) if lora_rank else 0
    gathered = max(flops.embedding_params(config), flops.layer_params(config)) * _BF16 if fsdp > 1 else 0
    if lora_rank:
        weights, optimizer, compute_copy = _BF16 * params / fsdp, 4 * _F32 * adapters, _BF16 * adapters
    else:
        weights, optimizer, compute_copy = _F32 * params / fsdp, 3 * _F32 * params / fsdp, _BF16 * params / fsdp
    estimate = {
        "weights": weights,
        "gradients_and_optimizer": optimizer,
        "compute_copy": compute_copy + gathered,
        "activations": batch_per_chip * seq_len * _activation_bytes_per_token(config, seq_len),
    }
    return {key: math.ceil(value) for key, value in estimate.items()} | {
        "total": math.ceil(sum(estimate.values())),
    }


@dataclasses.dataclass(frozen=True)
class Shape:
    accelerator: str  # as in the stack config, e.g. "v6e"
    topology: str  # e.g. "2x4"

    @property
    def chips(self) -> int:
        return math.prod(int(side) for side in self.topology.split("x"))


def table(models: dict, shapes: list[Shape], *, global_batch_size: int, seq_len: int, lora_rank: int) -> str:
    """A Markdown table of the estimate for every model, shape and mode (full and LoRA), FSDP over each slice."""
    header = (
        "| model | mode | slice | batch/chip | weights+optimizer+copy GiB | activations GiB | total GiB | HBM GiB | fits |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    rows = [header]
    for name, config in models.items():
        for shape in shapes:
            if global_batch_size % shape.chips:
                raise UserError(f"--batch-size {global_batch_size} does not divide over {shape.chips} chips")
            batch_per_chip = global_batch_size // shape.chips
            hbm = hardware.hbm_bytes(hardware.DEVICE_KIND_OF_ACCELERATOR[shape.accelerator])
            for mode, rank in (("full", 0), (f"LoRA r={lora_rank}", lora_rank)):
                estimate = estimate_bytes_per_chip(
                    config,
                    chips=shape.chips,
                    fsdp=shape.chips,
                    lora_rank=rank,
                    batch_per_chip=batch_per_chip,
                    seq_len=seq_len,
                )
                state = estimate["total"] - estimate["activations"]
                fits = "yes" if estimate["total"] <= hbm else "no"
                rows.append(
                    f"| {name} | {mode} | {shape.accelerator} {shape.topology} | {batch_per_chip} "
                    f"| {state / _GIB:.1f} | {estimate['activations'] / _GIB:.1f} "
                    f"| {estimate['total'] / _GIB:.1f} | {hbm / _GIB:.0f} | {fits} |"
                )
    return "\n".join(rows)


def _shape(text: str) -> Shape:
    accelerator, _, topology = text.partition(":")
    sides = topology.split("x")
    if accelerator not in hardware.DEVICE_KIND_OF_ACCELERATOR or not all(side.isdigit() and int(side) > 0 for side in sides):
        raise argparse.ArgumentTypeError(
            f"expected ACCELERATOR:TOPOLOGY with an accelerator of {', '.join(hardware.DEVICE_KIND_OF_ACCELERATOR)}, "
            f"e.g. v6e:2x4; got {text!r}"
        )
    return Shape(accelerator, topology)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


@jax_entry_point()
def main(argv=None) -> int | None:
    from trainer import config
    from trainer.model import models  # gemma's import is slow: only the CLI pays for it

    defaults = config.TrainConfig()
    parser = argparse.ArgumentParser(
        prog="python -m trainer.measure.memory",
        description="Estimated memory per chip of full and LoRA fine-tunes, FSDP over each slice.",
    )
    parser.add_argument("--models", nargs="+", choices=list(config.GEMMA3_MODELS),
                        default=["gemma3-270m", "gemma3-1b", "gemma3-4b"], help="models to estimate")
    parser.add_argument("--shapes", nargs="+", type=_shape, default=[Shape("v6e", "1x1"), Shape("v6e", "2x4")],
                        help="slices as ACCELERATOR:TOPOLOGY (default v6e:1x1 v6e:2x4)")
    parser.add_argument("--batch-size", type=_positive_int, default=defaults.batch_size,
                        help=f"global batch size in rows (default {defaults.batch_size}, the trainer's)")
    parser.add_argument("--seq-len", type=_positive_int, default=defaults.seq_len,
                        help=f"tokens per row (default {defaults.seq_len}, the trainer's)")
    parser.add_argument("--lora-rank", type=_positive_int, default=16, help="rank of the LoRA rows (default 16)")
    args = parser.parse_args(argv)
    # vocab_size sizes only the tiny model, which has no row here.
    configs = {name: models.model_config(name, vocab_size=0) for name in args.models}
    print(table(configs, args.shapes, global_batch_size=args.batch_size, seq_len=args.seq_len, lora_rank=args.lora_rank))
    print(f"\nGlobal batch {args.batch_size} x {args.seq_len} tokens. Formula: trainer/measure/memory.py.")


if __name__ == "__main__":
    sys.exit(main())
