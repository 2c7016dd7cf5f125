"""--compilation-cache-dir: a second start of the same run reads its compiled programs back from JAX's
persistent compilation cache instead of compiling them (gemma3-1b's step takes minutes to compile on a v5e
chip: every restart paid them again), compiles nothing, and says so in one line; a changed program misses."""

import re
import subprocess
import sys
import types

import jax
import pytest
from etils import epath

from tests.trainer.test_bad_inputs import REPO
from tests.trainer.test_train import tiny_args
from trainer.measure import compiled as compiled_module
from trainer.run import compile_answers, hbm

LINE = re.compile(r"trainer: compilation cache (?P<path>\S+): (?P<hits>\d+) programs read back \(about \d+ s of compiling "
                  r"saved\), (?P<compiled>\d+) compiled \([\d.]+ s(?P<names>.*)\), (?P<writes>\d+) written$")


def _start(workdir, prepared_dir, tokenizer_path, cache, *extra) -> dict:
    done = subprocess.run([sys.executable, "-m", "trainer", *tiny_args(workdir, prepared_dir, tokenizer_path, "--steps", "1",
                                                                    "--eval-fraction", "0", "--compilation-cache-dir", str(cache),
                                                                    *extra)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [match for match in map(LINE.match, done.stderr.splitlines()) if match]
    assert len(lines) == 1, done.stderr[-3000:]
    line = lines[0]
    return {"hits": int(line["hits"]), "compiled": int(line["compiled"]), "writes": int(line["writes"]),
            "names": re.findall(r", (\S+) [\d.]+ s", line["names"]), "path": line["path"]}


def test_a_second_start_compiles_nothing_and_a_changed_program_misses(tmp_path, prepared_dir, tokenizer_path):
    cache = tmp_path / "compiles"
    first = _start(tmp_path / "first", prepared_dir, tokenizer_path, cache)
    # Every program is kept, however short its compile (JAX's default keeps those of a second or more).
    assert first["hits"] == 0 and first["compiled"] == first["writes"] > 1 and first["path"] == str(cache), first
    kept = sorted(path.name for path in cache.iterdir())
    # Another workdir, the same programs: all read back, none compiled.
    second = _start(tmp_path / "second", prepared_dir, tokenizer_path, cache)
    assert second == {"hits": first["writes"], "compiled": 0, "writes": 0, "names": [], "path": str(cache)}
    assert sorted(path.name for path in cache.iterdir()) == kept
    # Another learning rate is another train step (its schedule is in the program): that one compiles again.
    changed = _start(tmp_path / "changed", prepared_dir, tokenizer_path, cache, "--lr", "1e-3")
    assert changed["compiled"] == changed["writes"] == 1 and changed["names"] == ["jit(train)"], changed
    assert changed["hits"] == first["writes"] - 1


REFUSAL = ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 256.00G of "
           "15.75G hbm. Total hbm usage >= 256.00G: reserved 1.00M program 256.00G arg 4.00K; 256.00G required for "
           "temporary allocations (256.00G) exceeds available HBM (15.75G)")


class _Program:
    """A lowered program that the compiler refuses for memory, or compiles; its compiles are counted."""

    def __init__(self, text: str, *, refused: bool):
        self.text, self.refused, self.compiles = text, refused, 0

    def as_text(self) -> str:
        return self.text

    def compile(self, options):
        self.compiles += 1
        if self.refused:
            raise jax.errors.JaxRuntimeError(REFUSAL)
        return f"the executable of {self.text}"


def test_a_memory_refusal_is_kept_in_the_cache_and_not_compiled_at_the_next_start(tmp_path, monkeypatch):
    # What use_persistent_cache sets (it also turns on JAX's cache for the whole process, which a test must not).
    monkeypatch.setattr(compile_answers, "_kept", epath.Path(tmp_path))
    device = types.SimpleNamespace(id=0, device_kind="TPU v5 lite")
    probe = _Program("module @too_large", refused=True)
    for _ in range(2):  # the first start and the next: the same refusal, compiled once
        with pytest.raises(jax.errors.JaxRuntimeError) as raised:
            compile_answers.compile(probe, what="a probe", devices=[device])
        assert hbm.memory_refusal(raised.value).available == int(15.75 * 2**30)
    assert probe.compiles == 1
    # Another program, or the same on another chip, is compiled; a program that compiles is JAX's to keep.
    other = _Program("module @too_large_too", refused=True)
    with pytest.raises(jax.errors.JaxRuntimeError):
        compile_answers.compile(other, what="another", devices=[types.SimpleNamespace(id=0, device_kind="TPU v6 lite")])
    fits = _Program("module @fits", refused=False)
    assert [compile_answers.compile(fits, what="a step", devices=[device]) for _ in range(2)] == ["the executable of module @fits"] * 2
    assert other.compiles == 1 and fits.compiles == 2
    assert len(list((tmp_path / compile_answers.REFUSALS).iterdir())) == 2  # no partial file left beside them


def test_remat_auto_reads_its_speed_estimates_back_at_the_next_start(tmp_path, monkeypatch):
    """--remat auto's estimate of a policy compiles the loss head alone and reads the whole optimized program
    (CompiledStep): with the cache, a start after the first reads the figures back by the program's key, so
    it estimates (and so chooses) the same without working them out; a changed program works them out again."""
    monkeypatch.setattr(compile_answers, "_kept", epath.Path(tmp_path))
    worked_out = []

    def compiled_step(candidate, lowered, compiled, config, model_config):
        worked_out.append(lowered.text)
        return types.SimpleNamespace(figures=lambda: {"flops": 1e14 * len(lowered.text), "bytes": 3e11, "ici": 0.0})

    monkeypatch.setattr(compiled_module, "compiled_step", compiled_step)
    estimate = compiled_module.speed_estimate(None, None, [types.SimpleNamespace(id=0, device_kind="TPU v5 lite")])
    candidate = types.SimpleNamespace(layers=types.SimpleNamespace(remat="dots"))
    step, other = _Program("module @step", refused=False), _Program("module @step_changed", refused=False)
    starts = [estimate(candidate, step, "its executable") for _ in range(2)]
    assert starts[0] == starts[1] and starts[0].remat == "dots" and worked_out == ["module @step"]
    assert estimate(candidate, other, "its executable") != starts[0] and worked_out == ["module @step", "module @step_changed"]
    assert len(list((tmp_path / compile_answers.ESTIMATES).iterdir())) == 2  # no partial file left beside them
