"""--remat auto takes the fastest policy that fits by the compiler's figures, not the first (trainer.run.step)."""

import dataclasses

import jax.numpy as jnp
import pytest

from trainer.config import TrainConfig
from trainer.model import models
from trainer.run import compile_answers, mesh, step

VOCAB = 64
CONFIG = TrainConfig(model="tiny", weights="random", batch_size=2, seq_len=16, steps=2, remat="auto")


@pytest.fixture(scope="module")
def tiny_run_step(tmp_path_factory):
    """The tiny step, compiled inside fit's session: each policy's program is compiled once for all the tests."""
    model_config = models.model_config("tiny", vocab_size=VOCAB)
    run_step = step.build_run_step(CONFIG, model_config, mesh.build_mesh(CONFIG.mesh), total_steps=2, compute_dtype=jnp.float32)
    with compile_answers.session(cache_dir=tmp_path_factory.mktemp("answers"), stream=None):
        yield run_step, model_config


def _speed(candidate, figures: dict[str, tuple[float, str]]) -> step.RematSpeed:
    seconds, bound_by = figures[candidate.layers.remat]
    return step.RematSpeed(remat=candidate.layers.remat, seconds=seconds, bound_by=bound_by)


def _choose(tiny_run_step, figures: dict[str, tuple[float, str]], **kept_speed):
    """compile_run_step with an estimate that answers `figures` for each policy; (chosen step, policies estimated)."""
    run_step, model_config = tiny_run_step
    estimated = []

    def estimate(candidate, lowered, compiled):
        estimated.append(candidate.layers.remat)
        return _speed(candidate, figures)

    chosen, _, compiled = step.compile_run_step(run_step, CONFIG, model_config, estimate=estimate, **kept_speed,
                                                train_args=lambda candidate: step.abstract_train_args(candidate, CONFIG, model_config))
    assert compiled is not None
    return chosen, estimated


def test_policies_whose_estimates_a_start_before_kept_are_not_compiled_unless_chosen(tiny_run_step, monkeypatch):
    """A restart with the compilation cache: each policy's estimate is read back by its program; it fitted when it
    was estimated, so only the chosen one is compiled (read back from JAX's cache), and the choice is the same."""
    figures = {"none": (2.0, "bytes"), "dots": (1.0, "flops"), "full": (1.5, "flops")}
    compiled = []
    compile = compile_answers.compile
    monkeypatch.setattr(compile_answers, "compile", lambda lowered, **kw: compiled.append(kw["what"]) or compile(lowered, **kw))
    chosen, estimated = _choose(tiny_run_step, figures, kept_speed=lambda candidate, lowered: _speed(candidate, figures))
    assert chosen.layers.remat == "dots" and estimated == [] and len(compiled) == 1 and "remat dots" in compiled[0], compiled


def test_a_step_bound_by_hbm_bytes_gives_way_to_a_faster_policy_that_recomputes_more(tiny_run_step):
    chosen, estimated = _choose(tiny_run_step, {"none": (2.0, "bytes"), "dots": (1.0, "bytes"), "full": (1.5, "flops")})
    assert chosen.layers.remat == "dots" and estimated == ["none", "dots", "full"]
    assert [speed.remat for speed in chosen.remat_speeds] == ["dots", "none", "full"]  # the chosen first, for the start line
    assert step.speed_words(chosen.remat_speeds).startswith("remat dots (1 s a step")


@pytest.mark.parametrize("figures, compiled", [
    ({"none": (1.0, "flops")}, ["none"]),  # bound by FLOPs: more recomputation cannot be faster
    ({"none": (1.0, "ici")}, ["none"]),  # nor by collectives
    ({"none": (2.0, "bytes"), "dots": (1.0, "flops")}, ["none", "dots"]),
])
def test_no_policy_is_compiled_that_cannot_be_faster(tiny_run_step, figures, compiled):
    chosen, estimated = _choose(tiny_run_step, figures)
    assert estimated == compiled and chosen.layers.remat == compiled[-1]


def test_without_an_estimate_the_first_policy_that_fits_is_taken(tiny_run_step):
    run_step, model_config = tiny_run_step
    chosen, _, _ = step.compile_run_step(run_step, CONFIG, model_config,
                                         train_args=lambda candidate: step.abstract_train_args(candidate, CONFIG, model_config))
    assert chosen.layers.remat == "none" and chosen.remat_speeds == ()


def test_a_pinned_policy_is_not_estimated(tiny_run_step):
    """--remat dots has nothing to be compared with: no estimate (fit's figures cost compiles), no start line."""
    run_step, model_config = tiny_run_step
    pinned = dataclasses.replace(CONFIG, remat="dots")
    chosen, _, _ = step.compile_run_step(run_step, pinned, model_config, estimate=lambda *_: pytest.fail("estimated"),
                                         train_args=lambda candidate: step.abstract_train_args(candidate, pinned, model_config))
    assert chosen.layers.remat == "dots" and chosen.remat_speeds == ()
