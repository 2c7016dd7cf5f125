"""A tiny chat fine-tune end to end: raw JSONL through the trainer (bad rows skipped and counted), the
format stated in config.json and the log, eval over the trained tokens only, and `python -m trainer.generate`."""

import contextlib
import io
import json
import os
import pathlib
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trainer import contract, loop
from trainer.model import models, sampling
from trainer.nn import loss

from trainer.data import loader as data_lib
from trainer.config import parse_config
from trainer.export import main as export_main
from trainer.generate import main as generate
from trainer.run.metrics import read_metrics
from trainer.data.tokenizer import load_tokenizer

SEQ_LEN, BATCH, EVAL_FRACTION = 64, 8, 0.1
REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory, chat_corpus_path, chat_tokenizer_path):
    folder = tmp_path_factory.mktemp("chat_run")
    raw = folder / "chats.jsonl"
    raw.write_text(chat_corpus_path.read_text() + "{not json\n")
    workdir = folder / "run"
    with contextlib.redirect_stdout(io.StringIO()) as out:
        loop.train(parse_config([
            "--model", "tiny", "--weights", "random", "--tokenizer", str(chat_tokenizer_path), "--data", str(raw),
            "--on-bad-row", "skip", "--workdir", str(workdir), "--seq-len", str(SEQ_LEN), "--batch-size", str(BATCH),
            "--eval-fraction", str(EVAL_FRACTION), "--steps", "80", "--lr", "3e-3", "--warmup-steps", "10",
            "--eval-interval", "80", "--checkpoint-interval", "80", "--compute-dtype", "float32", "--no-samples"]))
    (workdir / "stdout.txt").write_text(out.getvalue())
    return workdir


def test_the_data_format_and_skipped_rows_are_stated_in_config_json(chat_run):
    config = json.loads((chat_run / "config.json").read_text())
    assert (config["data_format"], config["loss_on"], config["skipped_rows"]) == ("jsonl-chat", "completions", {"not-json": 1})


def test_eval_loss_is_the_mean_over_the_trained_tokens_only(chat_run, chat_tokenizer):
    config = json.loads((chat_run / "config.json").read_text())
    data = data_lib.open_data(config["data"], tokenizer=chat_tokenizer, cache_dir=str(chat_run / "data_cache"))
    model_config = models.model_config("tiny", vocab_size=data.vocab_size)
    params = models.load_weights(str(chat_run / "export" / "params"), flag="--weights", out_shardings=None,
                                 expected=jax.eval_shape(lambda: models.init_params(model_config, seed=0)))
    model = models.build_model(model_config, dtype=jnp.float32)
    trained_sum = trained_count = every_sum = every_count = 0.0
    for batch in data_lib.batches(data, seq_len=SEQ_LEN, global_batch_size=BATCH, seed=0, split="eval",
                                  eval_fraction=EVAL_FRACTION, epochs=1, prefetch=False):
        hidden = loss.hidden_states(model, params, batch)
        losses = np.asarray(loss.token_losses(hidden, params["embedder"]["input_embedding"], batch["target_tokens"]))
        real = batch["segment_ids"] > 0
        trained_sum, trained_count = trained_sum + (losses * batch["loss_mask"]).sum(), trained_count + batch["loss_mask"].sum()
        every_sum, every_count = every_sum + losses[real].sum(), every_count + real.sum()
    eval_loss = read_metrics(chat_run / "metrics.jsonl")[-1]["eval_loss"]
    assert eval_loss == pytest.approx(trained_sum / trained_count, rel=1e-4)
    assert trained_count < 0.6 * every_count  # the questions and the markup are most of each row, and untrained
    assert abs(eval_loss - every_sum / every_count) > 0.1


def test_the_run_states_its_data_and_the_skipped_rows_in_its_first_lines(chat_run):
    first_lines = (chat_run / "stdout.txt").read_text().splitlines()[:2]
    assert first_lines[0] == "[data, step 1]"
    assert first_lines[1].startswith(f"{chat_run.parent / 'chats.jsonl'}: jsonl-chat, 300 documents, ")
    assert first_lines[1].endswith("tokens, loss on completions; skipped 1 bad rows (not-json 1)")


def test_generate_answers_a_chat_prompt_greedily_and_stops_at_the_end_of_turn(chat_run, capsys):
    argv = ["--run", str(chat_run), "--prompt", "Hello!", "--max-new-tokens", "24"]
    assert generate(argv) == contract.OK
    first = capsys.readouterr().out
    assert generate(argv) == contract.OK
    assert capsys.readouterr().out == first  # greedy: the same answer every time
    assert first == "Hello! How can I help you today?\n"


def test_generate_renders_the_prompt_as_a_user_turn_unless_told_not_to(chat_run, chat_tokenizer_path, monkeypatch, capsys):
    tokenizer = load_tokenizer(chat_tokenizer_path)
    seen = []
    generate_ids = sampling.generate_ids
    monkeypatch.setattr(sampling, "generate_ids", lambda model, params, prompt_ids, **kw: seen.append((prompt_ids, kw))
                        or generate_ids(model, params, prompt_ids, **kw))
    assert generate(["--run", str(chat_run), "--prompt", "Hi!", "--max-new-tokens", "4"]) == contract.OK
    assert generate(["--run", str(chat_run), "--prompt", "Hi!", "--max-new-tokens", "4", "--no-chat"]) == contract.OK
    (chat_ids, chat_options), (text_ids, text_options) = seen
    assert chat_ids[0] == tokenizer.bos_id
    assert tokenizer.decode(chat_ids[1:]) == "<start_of_turn>user\nHi!<end_of_turn>\n<start_of_turn>model\n"
    assert tokenizer.processor.piece_to_id("<end_of_turn>") in chat_options["stop_ids"]
    assert tokenizer.decode(text_ids[1:]) == "Hi!" and text_options["stop_ids"] == (tokenizer.eos_id,)
    assert capsys.readouterr().out.splitlines()[1].startswith("Hi!")  # text: the prompt continued


def test_top_p_keeps_the_most_likely_tokens_that_reach_it():
    logits = jnp.log(jnp.array([0.2, 0.5, 0.3]))
    kept = lambda top_p: np.isfinite(np.asarray(sampling._top_p_logits(logits, jnp.float32(top_p)))).tolist()  # noqa: E731
    assert kept(0.5) == [False, True, False]
    assert kept(0.7) == [False, True, True]
    assert kept(1.0) == [True, True, True]


def test_sampling_follows_the_seed_and_a_tiny_top_p_is_greedy(chat_run, capsys):
    def answer(*flags):
        assert generate(["--run", str(chat_run), "--prompt", "What is 3 plus 4?", "--max-new-tokens", "12", *flags]) == 0
        return capsys.readouterr().out

    assert answer("--temperature", "0.7", "--top-p", "1e-6", "--seed", "3") == answer()
    hot = [answer("--temperature", "5", "--seed", str(seed)) for seed in (1, 1, 2, 3)]
    assert hot[0] == hot[1] and len(set(hot)) > 1


@pytest.mark.parametrize("make, message", [
    (lambda run: None, "no run there (no config.json)"),
    (lambda run: (run / "config.json").write_text("{"), "config.json does not read"),
])
def test_a_workdir_without_a_run_is_one_line(tmp_path, capsys, make, message):
    tmp_path.mkdir(exist_ok=True)
    make(tmp_path)
    assert generate(["--run", str(tmp_path), "--prompt", "hi"]) == contract.USER_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and err.startswith("trainer.generate: error: --run ")


def test_a_run_with_neither_checkpoint_nor_export_is_one_line(tmp_path, chat_run, capsys):
    (tmp_path / "config.json").write_text((chat_run / "config.json").read_text().replace(
        str(chat_run / "checkpoints"), str(tmp_path / "checkpoints")))
    assert generate(["--run", str(tmp_path), "--prompt", "hi"]) == contract.USER_ERROR
    assert "no checkpoint in" in capsys.readouterr().err


def test_the_export_answers_through_transformers_as_generate_does(chat_run, tmp_path, capsys):
    """What `make chat-demo` ends with: the run's Hugging Face export, loaded by transformers
    (trainer.hf.sample in the HF environment), gives the JAX model's greedy answers."""
    hf_python = pathlib.Path(os.environ.get("HF_PYTHON") or REPO / ".venv-hf" / "bin" / "python")
    if not hf_python.exists():
        pytest.skip(f"no Hugging Face environment at {hf_python}: run `make .venv-hf/.installed` (or set HF_PYTHON)")
    prompts = ["Hello!", "What is 3 plus 4?", "The cup is red and the box is blue. What colour is the box?"]
    jax_answers = []
    for prompt in prompts:
        assert generate(["--run", str(chat_run), "--prompt", prompt, "--max-new-tokens", "16"]) == contract.OK
        jax_answers.append(capsys.readouterr().out.strip())
    # float32, as the checkpoint generate reads: bfloat16 rounding could flip a near tie.
    assert export_main(["--run", str(chat_run), "--format", "hf", "--out", str(tmp_path / "hf"), "--dtype", "float32"]) in (None, 0)
    capsys.readouterr()
    result = subprocess.run(
        [str(hf_python), "-m", "trainer.hf.sample", "--model", str(tmp_path / "hf"), "--max-new-tokens", "16",
         *(arg for prompt in prompts for arg in ("--prompt", prompt))],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    hf_answers = [line.removeprefix("model (transformers): ") for line in result.stdout.splitlines() if line.startswith("model (")]
    assert hf_answers == jax_answers
    assert jax_answers[0] == "Hello! How can I help you today?"
