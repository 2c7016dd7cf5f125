"""`python -m trainer.generate --run WORKDIR --prompt "..."`: a trained run answers a prompt.

The run's config.json says the model, tokenizer, LoRA rank, checkpoint directory and data format.
The weights are the latest checkpoint's (the trained params only; a LoRA run's frozen base comes from
its --weights, as when it resumes), or WORKDIR/export/params when there is no checkpoint. The prompt
is rendered as a user turn of Gemma's chat template when the run trained on chat data (or --chat),
and the generation stops at <end_of_turn>. Greedy unless --temperature is above 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys

from trainer.errors import UserError, entry_point

DEFAULT_MAX_NEW_TOKENS = 128


def read_run_config(workdir: pathlib.Path) -> dict:
    path = workdir / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"--run {workdir}: no run there (no config.json); pass the --workdir of a "
                        "`python -m trainer` run") from None
    except (OSError, ValueError) as error:
        raise UserError(f"--run {workdir}: config.json does not read ({error}); pass the --workdir of a "
                        "`python -m trainer` run") from None


def _train_config(run: dict):
    """The run's TrainConfig, from the options config.json records (it adds resolved facts beside them)."""
    from trainer.config import TrainConfig

    fields = {field.name for field in dataclasses.fields(TrainConfig)} - {"mesh"}
    return TrainConfig(**{key: value for key, value in run.items() if key in fields})


def _latest_checkpoint_params(config, run: dict, model_config):
    """(params for the forward pass's model, lora_rank of that model) from the newest checkpoint, or None."""
    import jax
    import orbax.checkpoint as ocp

    from trainer.model import models
    from trainer.run import checkpoint, step
    from trainer.run import optimizer as optimizer_lib

    directory = checkpoint.absolute_path(run["checkpoint_dir"])
    if not directory.exists():
        return None
    manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(create=False),
                                    item_names=("state", "data"))
    latest = manager.latest_step()
    if latest is None:
        return None
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shard = lambda tree: jax.tree.map(lambda _: device, tree)  # noqa: E731
    trained, frozen = models.initial_params(config, model_config, shard, resuming=True)
    optimizer = optimizer_lib.build_optimizer(optimizer_lib.optimizer_config(config, total_steps=run.get("total_steps") or 1))
    abstract = step.abstract_state(trained, optimizer, state_shardings_fn=shard)
    restored = manager.restore(latest, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
    manager.close()
    return restored["state"]["params"], frozen


def load_run(workdir: pathlib.Path, run: dict):
    """(model, params in the compute dtype, tokenizer) of the run in `workdir`."""
    import jax.numpy as jnp

    from trainer.model import models
    from trainer.nn import precision
    from trainer.run import step
    from trainer.data.tokenizer import load_tokenizer

    config = _train_config(run)
    tokenizer = load_tokenizer(run["tokenizer"])
    images = bool((run.get("model_config") or {}).get("vision"))  # a vision-language run's (it answers text here)
    model_config = models.model_config(config.model, vocab_size=tokenizer.vocab_size, images=images)
    compute_dtype = precision.compute_dtype(config.compute_dtype)
    restored = _latest_checkpoint_params(config, run, model_config)
    if restored is not None:
        trained, frozen = restored
        model = models.build_model(model_config, dtype=compute_dtype, lora_rank=config.lora_rank)
        return model, step.forward_params(trained, frozen, compute_dtype), tokenizer
    export = workdir / "export" / "params"
    if not export.exists():
        raise UserError(f"--run {workdir}: no checkpoint in {run['checkpoint_dir']} and no export/params; train the "
                        "run first (python -m trainer --workdir ...)")
    import jax

    expected = jax.eval_shape(lambda: models.init_params(model_config, seed=config.seed))
    params = models.load_weights(str(export), flag="--run", expected=expected, out_shardings=None)
    model = models.build_model(model_config, dtype=compute_dtype)
    return model, jax.tree.map(lambda p: p.astype(compute_dtype), params), tokenizer


def _is_chat_run(run: dict) -> bool:
    from trainer.data import formats

    return formats.kind_of(run.get("data_format", formats.TEXT)) != formats.TEXT


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="the run's --workdir (holds config.json, checkpoints/, export/)")
    parser.add_argument("--prompt", required=True, help="the text to answer (chat) or continue")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                        help=f"most tokens generated (default {DEFAULT_MAX_NEW_TOKENS})")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); above 0: sampled")
    parser.add_argument("--top-p", type=float, default=1.0, help="with --temperature: sample from the most likely "
                        "tokens whose probabilities reach this (default 1.0: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
    parser.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                        help="render the prompt with Gemma's chat template (default: when the run's data is chat)")
    args = parser.parse_args(argv)
    if args.max_new_tokens < 1:
        parser.error("--max-new-tokens must be at least 1")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        parser.error("--temperature must be at least 0 and --top-p in (0, 1]")
    return args


@entry_point(prefix="trainer.generate: ")
def main(argv=None) -> int | None:
    args = parse_args(argv)
    workdir = pathlib.Path(args.run)
    run = read_run_config(workdir)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from trainer.model import sampling
    from trainer.run import mesh

    mesh.require_requested_platform()

    model, params, tokenizer = load_run(workdir, run)
    chat_template = _is_chat_run(run) if args.chat is None else args.chat
    print(sampling.complete(model, params, tokenizer, args.prompt, chat_template=chat_template,
                            max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                            seed=args.seed))


if __name__ == "__main__":
    sys.exit(main())
