"""What a run keeps on the device while it trains: at its first step exactly the step's state, the frozen
base (LoRA) and the batch. Anything more (the initial float32 weights after the state was built from
them) is memory the step planned without, as happened on the TPU v5e chip: gemma3-1b lean-factored fit
the compiler (14.70 GiB) and ran out of memory at step 1 with the float32 initial weights still live."""

import dataclasses

import jax
import pytest

from tests.trainer.test_train import tiny_args
from trainer import loop
from trainer.config import parse_config


def _bytes(tree) -> int:
    return sum(leaf.nbytes for leaf in jax.tree.leaves(tree))


@pytest.mark.parametrize("settings", [
    ("--precision", "float32"),
    ("--precision", "lean"),
    ("--precision", "lean-factored"),
    ("--lora-rank", "4"),
], ids=lambda settings: " ".join(settings))
def test_at_its_first_step_a_run_holds_only_state_frozen_weights_and_batch(tmp_path, prepared_dir, tokenizer_path,
                                                                          monkeypatch, settings):
    seen = {}
    run = loop.StepLoop.run

    def run_recording_the_first_step(self, state, train_batches, start_step):
        train = self.functions.train

        def first_step_recorded(state, frozen, batch):
            if not seen:
                new = [a for a in jax.live_arrays() if id(a) not in before and not a.is_deleted()]
                arguments = {id(leaf) for leaf in jax.tree.leaves((state, frozen, batch))}
                seen.update(live=sum(a.nbytes for a in new), state=_bytes(state), frozen=_bytes(frozen),
                            batch=_bytes(batch), others=[(a.dtype.name, a.shape) for a in new if id(a) not in arguments])
            return train(state, frozen, batch)

        self.functions = dataclasses.replace(self.functions, train=first_step_recorded)
        return run(self, state, train_batches, start_step)

    monkeypatch.setattr(loop.StepLoop, "run", run_recording_the_first_step)
    config = parse_config(tiny_args(tmp_path, prepared_dir, tokenizer_path, "--steps", "1", "--eval-fraction", "0",
                                    *settings))
    before = {id(a) for a in jax.live_arrays()}  # what other tests in this process keep is not the run's
    loop.train(config)

    expected = seen["state"] + seen["frozen"] + seen["batch"]
    assert seen["live"] == expected, (
        f"live {seen['live']} bytes at step 1, the step's arguments {expected} (state {seen['state']}, "
        f"frozen {seen['frozen']}, batch {seen['batch']}); {len(seen['others'])} other arrays, the first "
        f"{seen['others'][:3]}")
