"""How an accelerator-benchmark side settles its batch and its training on a device's memory."""

import pytest

from bench import device_side
from bench.side import Side, StepCounts
from bench.throughput import Schedule
from trainer.model import models

V5E_BYTES = int(15.7 * 2**30)  # what JAX reports as one TPU v5e chip's bytes_limit


class SideThatFitsUpTo(Side):
    name = "ours"

    def __init__(self, batch: int, fits: int):
        super().__init__()
        self.batch_size, self.fits = batch, fits

    def _build(self):
        if self.batch_size > self.fits:
            raise RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm")
        return "compiled"

    def _dispatch(self, compiled):
        return StepCounts(useful_tokens=self.batch_size, positions=self.batch_size), None


def test_a_step_that_does_not_fit_is_halved_until_it_does(monkeypatch):
    monkeypatch.setattr(device_side, "make_side", lambda name, config, inputs, *, batch, **_: SideThatFitsUpTo(batch, fits=3))
    side, repeats, refused = device_side.fitted("ours", None, None, seq_len=8, batch=16, lora_rank=0,
                                                schedule=Schedule(0, 1, 1), log=lambda line: None)
    assert (side.batch_size, refused) == (2, [16, 8, 4])
    assert repeats.useful_tokens == [2]


def test_another_failure_is_not_taken_for_memory(monkeypatch):
    class Broken(SideThatFitsUpTo):
        def _build(self):
            raise ValueError("a bug")

    monkeypatch.setattr(device_side, "make_side", lambda name, config, inputs, *, batch, **_: Broken(batch, fits=1))
    with pytest.raises(ValueError, match="a bug"):
        device_side.fitted("ours", None, None, seq_len=8, batch=4, lora_rank=0, schedule=Schedule(0, 1, 1), log=print)


def test_on_a_v5e_chip_1b_trains_lora_and_270m_its_full_weights():
    """gemma3-1b's float32 weights, gradients and AdamW moments (16 bytes a parameter) exceed the chip."""
    assert device_side.ours_lora_rank(models.model_config("gemma3-270m", vocab_size=512), V5E_BYTES) == 0
    assert device_side.ours_lora_rank(models.model_config("gemma3-1b", vocab_size=512), V5E_BYTES) == device_side.LORA_RANK
    assert device_side.ours_lora_rank(models.model_config("gemma3-1b", vocab_size=512), None) == 0  # no figure: full


@pytest.mark.parametrize("side", ["ours", "baseline"])
def test_the_first_batch_shrinks_with_the_sequence_and_never_passes_the_cap(side):
    config = models.model_config("gemma3-1b", vocab_size=512)
    first = lambda seq_len, cap=64: device_side.first_batch(side, config, seq_len=seq_len, lora_rank=16 if side == "ours" else 0,  # noqa: E731
                                                            bytes_limit=V5E_BYTES, cap=cap)
    assert 1 <= first(4096) < first(1024) <= 64
    assert first(1024, cap=2) <= 2
    assert device_side.first_batch(side, config, seq_len=1024, lora_rank=0, bytes_limit=None, cap=32) == 32


def test_a_side_refused_even_at_batch_one_says_it_does_not_fit(monkeypatch):
    """The tutorial's method cannot train gemma3-1b at 4096 on one v5e chip: a figure, not a crash."""
    monkeypatch.setattr(device_side, "make_side", lambda name, config, inputs, *, batch, **_: SideThatFitsUpTo(batch, fits=0))
    with pytest.raises(device_side.DoesNotFit, match="batch 1 does not fit .*RESOURCE_EXHAUSTED") as refusal:
        device_side.fitted("baseline", None, None, seq_len=8, batch=4, lora_rank=0, schedule=Schedule(0, 1, 1), log=lambda line: None)
    assert refusal.value.refused == [4, 2, 1]
