"""A model whose embedding table has more rows than the tokenizer has pieces (Gemma's 262,144 for a
tokenizer of the user's own, which check_vocabulary allows) samples only ids the tokenizer has.

Before sampling masked the logits beyond the tokenizer, `python -m trainer` died at samples/before in
SentencePiece's `IndexError: piece id is out of range`, and `trainer.generate` did the same."""

import os
import pathlib
import subprocess
import sys

import pytest

from tests.trainer.wide_model_run import MODEL, WIDE_EMBEDDINGS
from trainer import contract
from trainer.data.tokenizer import load_tokenizer

REPO = pathlib.Path(__file__).resolve().parents[2]


def _run(module: str, *argv: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "tests.trainer.wide_model_run", module, *argv], cwd=REPO, env=environment,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


@pytest.fixture(scope="module")
def wide_run(tmp_path_factory, corpus_path, tokenizer_path):
    assert load_tokenizer(tokenizer_path).vocab_size < WIDE_EMBEDDINGS
    workdir = tmp_path_factory.mktemp("wide") / "run"
    result = _run("trainer", "--model", MODEL, "--weights", "random", "--tokenizer", str(tokenizer_path),
                  "--data", str(corpus_path), "--workdir", str(workdir), "--steps", "2", "--seq-len", "32",
                  "--batch-size", "2", "--eval-interval", "2", "--checkpoint-interval", "2", "--compute-dtype", "float32",
                  "--samples")  # fmt: skip
    return workdir, result


def test_the_trainer_samples_before_and_after_training_and_finishes(wide_run):
    workdir, result = wide_run
    assert result.returncode == contract.OK, result.stderr[-3000:]
    assert "samples/before" in result.stdout and "samples/after" in result.stdout


@pytest.mark.parametrize("temperature", ["0", "1.5"])
def test_generate_answers_greedily_and_sampled(wide_run, temperature):
    workdir, _ = wide_run
    result = _run("trainer.generate", "--run", str(workdir), "--prompt", "Once upon a time", "--max-new-tokens", "24",
                  "--temperature", temperature)  # fmt: skip
    assert result.returncode == contract.OK, result.stderr[-3000:]
    assert result.stdout.startswith("Once upon a time")


def test_the_export_answers_through_transformers_as_generate_does(wide_run, tmp_path):
    """trainer.hf.sample suppresses the same rows: transformers' greedy answer is the JAX model's."""
    hf_python = pathlib.Path(os.environ.get("HF_PYTHON") or REPO / ".venv-hf" / "bin" / "python")
    if not hf_python.exists():
        pytest.skip(f"no Hugging Face environment at {hf_python}: run `make .venv-hf/.installed` (or set HF_PYTHON)")
    workdir, _ = wide_run
    # float32, as the checkpoint generate reads: bfloat16 rounding could flip a near tie.
    exported = _run("trainer.export", "--run", str(workdir), "--out", str(tmp_path / "hf"), "--dtype", "float32")
    assert exported.returncode == contract.OK, exported.stderr[-3000:]
    prompt = "Once upon a time"
    jax = _run("trainer.generate", "--run", str(workdir), "--prompt", prompt, "--max-new-tokens", "12")
    hf = subprocess.run([str(hf_python), "-m", "trainer.hf.sample", "--model", str(tmp_path / "hf"), "--prompt", prompt,
                         "--max-new-tokens", "12"], cwd=REPO, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert hf.returncode == contract.OK, hf.stderr[-3000:]
    (reply,) = [line.removeprefix("model (transformers): ") for line in hf.stdout.splitlines() if line.startswith("model (")]
    assert jax.stdout.strip().removeprefix(prompt).strip() == reply
