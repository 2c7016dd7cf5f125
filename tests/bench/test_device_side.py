"""How an accelerator-benchmark side settles its batch and its training on a device's memory."""

import math

import pytest

from bench import device_side
from bench.side import Side, StepCounts
from bench.throughput import Schedule
from trainer.model import models
from trainer.run.step import RematSpeed

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
    side, repeats, refused = device_side.fitted("ours", None, None, seq_len=8, batch=16, training="full",
                                                schedule=Schedule(0, 1, 1), log=lambda line: None)
    assert (side.batch_size, refused) == (2, [16, 8, 4])
    assert repeats.useful_tokens == [2]


def test_another_failure_is_not_taken_for_memory(monkeypatch):
    class Broken(SideThatFitsUpTo):
        def _build(self):
            raise ValueError("a bug")

    monkeypatch.setattr(device_side, "make_side", lambda name, config, inputs, *, batch, **_: Broken(batch, fits=1))
    with pytest.raises(ValueError, match="a bug"):
        device_side.fitted("ours", None, None, seq_len=8, batch=4, training="full", schedule=Schedule(0, 1, 1), log=print)


class OursThatFitsUpTo(SideThatFitsUpTo):
    """Ours with the compiled step's bound by the compiler's figures (what --training auto compares)."""

    def __init__(self, batch: int, fits: int, seconds: float, built: list, closed: list, training: str):
        super().__init__(batch, fits)
        self.seconds, self.built, self.closed, self.training = seconds, built, closed, training

    def _build(self):
        self.built.append((self.training, self.batch_size))
        return super()._build()

    def speed(self):
        return RematSpeed(remat="none", seconds=self.seconds, bound_by="bytes")

    def close(self):
        self.closed.append(self.training)


def _auto(monkeypatch, fits: dict, seconds: dict):
    """auto_training over sides that fit up to `fits[training]` rows with a bound of `seconds[training]`; (its
    answer, the sides compiled as (training, batch), the trainings closed)."""
    built, closed = [], []
    monkeypatch.setattr(device_side, "make_side", lambda name, config, inputs, *, batch, training, **_: OursThatFitsUpTo(
        batch, fits[training], seconds.get(training, 1.0), built, closed, training))
    answer = device_side.auto_training(None, None, first=lambda training: 4, seq_len=8, schedule=Schedule(0, 1, 1), log=lambda line: None,
                                       step_options=None, least_recomputation="none", seconds_left=lambda: math.inf, measured_steps=1)
    return answer, built, closed


def test_auto_measures_the_fastest_full_fine_tune_it_compiled_and_says_what_it_refused(monkeypatch):
    """On a v5e chip gemma3-1b's float32 state (16 bytes a parameter) may not fit where the lean ones do: the
    compiler's refusal moves ours on; of those that fit, the one with more tokens a second by its bound is measured,
    as it was compiled (not compiled again), and the other is let go."""
    (training, side, repeats, refused, refusals, choice), built, closed = _auto(
        monkeypatch, fits={"full": 0, "lean": 2, "lean-factored": 4}, seconds={"lean": 0.1, "lean-factored": 0.15})
    assert (training, side.batch_size, refused, repeats.useful_tokens) == ("lean-factored", 4, [], [4])
    assert built == [("full", 4), ("full", 2), ("full", 1), ("lean", 4), ("lean", 2), ("lean-factored", 4)]
    assert closed == ["full", "full", "full", "lean", "lean"]  # each refused side, and lean once compared
    assert len(refusals) == 1 and refusals[0].startswith("full: batch 1 does not fit")
    assert choice.words().startswith("--training auto took lean-factored at batch 4 (")


def test_auto_trains_lora_where_no_full_fine_tune_fits_and_names_each_refusal(monkeypatch):
    (training, side, *_), built, _ = _auto(monkeypatch, fits={"full": 0, "lean": 0, "lean-factored": 0, "lora": 8}, seconds={})
    assert (training, side.batch_size, built[-1]) == ("lora", 4, ("lora", 4))
    with pytest.raises(device_side.DoesNotFit, match=r"full: .*; full, lean \(bfloat16 state\): .*; full, lean-factored \(bfloat16 state\): .*; LoRA rank 16: "):
        _auto(monkeypatch, fits=dict.fromkeys(device_side.TRAININGS, 0), seconds={})


@pytest.mark.parametrize("side", ["ours", "baseline"])
def test_the_first_batch_shrinks_with_the_sequence_and_never_passes_the_cap(side):
    config = models.model_config("gemma3-1b", vocab_size=512)
    first = lambda seq_len, cap=64: device_side.first_batch(side, config, seq_len=seq_len, training="lora",  # noqa: E731
                                                            bytes_limit=V5E_BYTES, cap=cap)
    assert 1 <= first(4096) < first(1024) <= 64
    assert first(1024, cap=2) <= 2
    assert device_side.first_batch(side, config, seq_len=1024, training="full", bytes_limit=None, cap=32) == 32


def test_a_side_refused_even_at_batch_one_says_it_does_not_fit(monkeypatch):
    """The tutorial's method cannot train gemma3-1b at 4096 on one v5e chip: a figure, not a crash."""
    monkeypatch.setattr(device_side, "make_side", lambda name, config, inputs, *, batch, **_: SideThatFitsUpTo(batch, fits=0))
    with pytest.raises(device_side.DoesNotFit, match="batch 1 does not fit .*RESOURCE_EXHAUSTED") as refusal:
        device_side.fitted("baseline", None, None, seq_len=8, batch=4, training="full", schedule=Schedule(0, 1, 1), log=lambda line: None)
    assert refusal.value.refused == [4, 2, 1]


def test_the_bytes_bound_leaves_out_operands_in_on_chip_memory():
    """The roofline's bytes are what the compiled program moves in HBM: a weight prefetched into the chip's
    on-chip memory (S(1)) counts once, as it is read from HBM, not again as the operands XLA's cost analysis
    counts there (tests/trainer/measure/test_hbm_traffic.py's v5e program)."""
    from tests.trainer.measure.test_hbm_traffic import ON_CHIP
    from trainer.run import hardware

    v5e = hardware.CHIPS["TPU v5 lite"]
    weight, adapter, tokens_grad, hidden_grad, adapter_grad = 6912 * 1152 * 2, 6912 * 16 * 4, 8192 * 1152 * 2, 8192 * 6912 * 2, 8192 * 16 * 2
    in_hbm = weight + adapter + tokens_grad + 2 * hidden_grad + adapter_grad
    bound = device_side.roofline(ON_CHIP, 1e9, v5e)
    assert bound["hbm_bytes_per_step"] == in_hbm
    assert (bound["bound_by"], bound["bytes_bound_s"]) == ("bytes", pytest.approx(in_hbm / v5e.hbm_bytes_per_s))
    assert device_side.roofline(ON_CHIP, 1e9, None) == {"bound_s": None, "bound_by": None}


def test_both_benchmarks_report_mfu_of_the_useful_tokens_and_name_it(monkeypatch):
    """bench.device_side's figures and bench.throughput's line take MFU from one definition: of the useful
    tokens (padding not counted), with every position's beside it, each named in the output."""
    import io
    import types

    from bench import throughput
    from bench.stats import Repeats

    ours, baseline = Repeats(), Repeats()
    ours.add(2.0, useful_tokens=600, positions=1000, steps=2)
    baseline.add(2.0, useful_tokens=500, positions=1000, steps=2)
    peak, per_token = 1e6, 1e3
    figures = throughput.mfu_figures(ours, per_token, peak)
    assert figures == {"mfu": pytest.approx(300 * per_token / peak), "mfu_all_positions": pytest.approx(500 * per_token / peak)}
    assert device_side.mfu_figures is throughput.mfu_figures
    monkeypatch.setattr(throughput.hardware, "peak_bf16_flops", lambda kind: peak)
    side = lambda name: types.SimpleNamespace(name=name, batch_size=4, compile_s=1.0, step_memory_bytes=lambda: 2**20,  # noqa: E731
                                              truncated_fraction=lambda: 0.0)
    out = io.StringIO()
    throughput.report([side("ours"), side("baseline")], {"ours": ours, "baseline": baseline}, flops_per_token=per_token, out=out)
    assert "MFU of useful tokens 30.0% (all positions 50.0%)" in out.getvalue().splitlines()[0]
