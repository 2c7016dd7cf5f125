"""`fit`'s compiles keep the compiler's answers: a second fit of an unchanged run compiles nothing and
reports the same figures, and each compile is a progress line saying what it is for."""

import dataclasses
import io

import jax
import pytest

from trainer.model import models
from trainer.run import hbm
from trainer.config import TrainConfig
from trainer.run import compile_answers
from trainer.measure import compiled

pytest.importorskip("libtpu", reason="libtpu is in requirements-dev.lock: run `make setup`")

# One policy and no precision comparison: the step is one compile (--remat auto may compare three, fit lean-factored).
TINY = TrainConfig(model="tiny", weights="random", batch_size=8, seq_len=256, steps=10, remat="none")


def _fit(cache_dir):
    hbm._usable_hbm.clear()  # the process remembers the chip's usable HBM; a new fit is a new process
    progress = io.StringIO()
    with compile_answers.session(cache_dir=cache_dir, stream=progress) as session:
        report = compiled.fit(TINY, compiled.tpu_devices("v6e", "2x2"), vocab_size=512, search_batch=False,
                               compare_precision=False).report()
    return report, session, progress.getvalue().splitlines()


def test_a_second_fit_of_an_unchanged_run_compiles_nothing(tmp_path, monkeypatch):
    first, session, lines = _fit(tmp_path)
    assert session.compiles == 2 and session.cached == 0  # the usable-HBM probe (a refusal) and the step
    assert any("train step, remat none (candidate 1 of " in line and line.endswith("compiling (compile 2)") for line in lines)
    monkeypatch.setattr(jax.stages.Lowered, "compile", lambda *_: pytest.fail("compiled what the cache holds"))
    second, session, lines = _fit(tmp_path)
    assert session.compiles == 0 and session.cached == 2
    assert all(line.endswith("from the cache") for line in lines)
    assert second == first


def test_another_program_is_another_answer(tmp_path):
    _fit(tmp_path)
    with compile_answers.session(cache_dir=tmp_path, stream=None) as session:
        compiled.compile_train_step(dataclasses.replace(TINY, steps=20), models.model_config("tiny", vocab_size=512),
                                    compiled.tpu_devices("v6e", "2x2"))
    assert session.compiles == 1  # another schedule length is another program


def test_outside_a_session_compile_is_the_compilers_executable():
    lowered = jax.jit(lambda x: x + 1).lower(jax.ShapeDtypeStruct((4,), jax.numpy.float32))
    executable = compile_answers.compile(lowered, what="x + 1", devices=jax.devices())
    assert executable(jax.numpy.zeros(4)).tolist() == [1.0] * 4


def test_a_programs_text_is_printed_once_for_its_cache_key_and_its_fingerprint(monkeypatch):
    """A start keys its train step (kept refusals and estimates) and fingerprints it for config.json: the program's
    text, about 0.3 s to print for gemma3-270m's step, is printed once for both (issue 50), and is each program's own."""
    from trainer.run import step

    lowered, other = (jax.jit(lambda x, factor=factor: x * factor).lower(jax.numpy.ones(4)) for factor in (2.0, 3.0))
    printed = []
    as_text = type(lowered).as_text
    monkeypatch.setattr(type(lowered), "as_text", lambda self, *args, **kwargs: printed.append(self) or as_text(self, *args, **kwargs))
    key, fingerprint = compile_answers.cache_key(lowered, jax.devices(), {}), step.step_fingerprint(lowered)
    assert printed == [lowered]
    assert compile_answers.cache_key(lowered, jax.devices(), {}) == key and step.step_fingerprint(lowered) == fingerprint
    assert compile_answers.cache_key(other, jax.devices(), {}) != key and step.step_fingerprint(other) != fingerprint
