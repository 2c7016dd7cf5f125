"""bench's --training auto takes the fastest full fine-tune the compiler fits, by its compiled bound per token, not the
first; it compiles no candidate that cannot be faster or that the time limit cannot measure (bench.training_choice)."""

import math
import types

import pytest

from bench.device_side import FULL_FINE_TUNES
from bench.training_choice import Candidate, choose
from trainer.run.step import RematSpeed

SEQ_LEN = 1024
MEASURED_STEPS = 23  # bench.device's schedule: 3 warm-up steps, 4 repeats of 5


def _choose(figures: dict, *, seconds_left: float = math.inf, compile_s: float = 60.0):
    """choose over full, lean and lean-factored, each compiled as `figures[training]` says: (batch, bound seconds,
    bound by[, remat]), seconds None for no chip's figures, or None where no batch fits; (choice, compiled, closed)."""
    compiled, closed = [], []

    def compile_candidate(training):
        compiled.append(training)
        if figures[training] is None:
            return None
        batch, seconds, bound_by, *remat = figures[training]
        side = types.SimpleNamespace(batch_size=batch, close=lambda: closed.append(training))
        speed = None if seconds is None else RematSpeed(remat=remat[0] if remat else "none", seconds=seconds, bound_by=bound_by)
        return Candidate(training, side, tokens_per_step=batch * SEQ_LEN, speed=speed, compile_s=compile_s)

    choice = choose(FULL_FINE_TUNES, compile_candidate, least_recomputation="none", seconds_left=lambda: seconds_left,
                    measured_steps=MEASURED_STEPS, log=lambda line: None)
    return choice, compiled, closed


def test_a_leaner_state_is_taken_where_its_bound_gives_more_tokens_a_second():
    """Full fits a batch of 4 in the shortest step, lean-factored 16 in a longer one that gives more tokens a second:
    the batches differ, so the tokens a step over the bound rank them, not the step time, nor the order."""
    choice, compiled, closed = _choose({"full": (4, 0.10, "bytes"), "lean": (8, 0.25, "bytes"), "lean-factored": (16, 0.30, "bytes")})
    assert (choice.chosen.training, choice.chosen.side.batch_size) == ("lean-factored", 16)
    assert compiled == ["full", "lean", "lean-factored"] and closed == ["lean", "full"]  # only the chosen stays compiled
    assert choice.words() == ("--training auto took lean-factored at batch 16 (54,613 tokens/s by the compiler's bound, bound by bytes), "
                              "over full at batch 4 (40,960, bytes), over lean at batch 8 (32,768, bytes)")
    figures = choice.figures()
    assert figures["training_choice"] == choice.words()
    assert [(entry["training"], entry["batch"], entry["bound_by"]) for entry in figures["trainings_compared"]] == [
        ("lean-factored", 16, "bytes"), ("full", 4, "bytes"), ("lean", 8, "bytes")]


@pytest.mark.parametrize("figures, compiled, chosen", [
    ({"full": (8, 0.3, "flops")}, ["full"], "full"),  # bound by FLOPs: a leaner state moves fewer bytes, not fewer FLOPs
    ({"full": (8, 0.3, "ici")}, ["full"], "full"),  # nor by collectives
    ({"full": (4, 0.1, "bytes"), "lean": (16, 0.3, "flops")}, ["full", "lean"], "lean"),
])
def test_no_candidate_is_compiled_that_cannot_be_faster(figures, compiled, chosen):
    choice, tried, _ = _choose(figures)
    assert tried == compiled and choice.chosen.training == chosen
    assert choice.not_compiled.startswith(f"{', '.join(FULL_FINE_TUNES[len(compiled):])} not compiled: {chosen} is bound by")
    assert choice.words().endswith(choice.not_compiled)


@pytest.mark.parametrize("figures", [
    # the fastest is bound by bytes, only a slower one by FLOPs
    {"full": (4, 0.1, "bytes"), "lean": (4, 0.2, "flops"), "lean-factored": (8, 0.15, "bytes")},
    # bound by FLOPs, but recomputing: a leaner state may leave room for less
    {"full": (4, 0.1, "flops", "full"), "lean": (4, 0.2, "flops", "dots"), "lean-factored": (8, 0.15, "bytes")},
])
def test_a_leaner_state_is_compiled_while_it_could_be_faster(figures):
    choice, compiled, _ = _choose(figures)
    assert compiled == list(FULL_FINE_TUNES) and choice.chosen.training == "lean-factored" and choice.not_compiled is None


def test_no_candidate_is_compiled_that_the_time_left_cannot_measure():
    """A compile took 60 s; the measurement needs 23 steps at up to 3x the 0.3 s bound and a 30 s reserve (51 s)."""
    figures = {"full": (8, 0.3, "bytes"), "lean": (16, 0.4, "bytes"), "lean-factored": (16, 0.35, "bytes")}
    choice, compiled, _ = _choose(figures, seconds_left=100.0)
    assert compiled == ["full"] and choice.chosen.training == "full"
    assert choice.not_compiled == ("lean, lean-factored not compiled: 100 s of the time limit left, a compile took 60 s and the "
                                   "measurement needs about 51 s")
    assert _choose(figures, seconds_left=120.0)[1] == list(FULL_FINE_TUNES)


def test_without_a_chips_figures_the_first_that_fits_is_taken_and_said():
    """The CPU dry run: no bound to compare by."""
    choice, compiled, _ = _choose({"full": None, "lean": (8, None, None), "lean-factored": (16, None, None)})
    assert compiled == ["full", "lean"] and choice.chosen.training == "lean"
    assert choice.words() == "--training auto took lean at batch 8, the first that fits: no chip's figures to compare them by"
    assert choice.figures()["trainings_compared"] == [{"training": "lean", "batch": 8, "compile_s": 60.0}]


def test_where_no_full_fine_tune_fits_there_is_no_choice():
    choice, compiled, _ = _choose(dict.fromkeys(FULL_FINE_TUNES))
    assert compiled == list(FULL_FINE_TUNES) and choice.chosen is None
    assert choice.figures() == {"training_choice": "--training auto: no full fine-tune fits", "trainings_compared": []}
