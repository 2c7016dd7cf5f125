"""`python -m trainer`: flags, the YAML file, presets, and one clear line with exit code 2 for what a user gets wrong."""

import os
import subprocess
import sys

import pytest

from trainer import contract
from trainer.__main__ import main
from trainer.config import PRESET_VALUES, TrainConfig, build_parser, parse_config
from trainer.data.tokenizer import train_tokenizer


def _fails(capsys, argv, message):
    assert main(argv) == contract.USER_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert message in err, err


def test_defaults_are_the_gemma3_270m_fine_tune():
    config = parse_config(["--data", "stories.txt"])
    assert (config.model, config.weights, config.seq_len, config.batch_size, config.lr) == ("gemma3-270m", "official", 256, 128, 2e-5)
    assert config.resolved_checkpoint_dir == "runs/train/checkpoints"
    assert config.mesh == {"data": -1, "fsdp": 1}


def test_preset_tiny_needs_nothing_else_and_flags_override_it():
    config = parse_config(["--preset", "tiny", "--steps", "40", "--workdir", "W"])
    assert (config.model, config.weights, config.steps, config.workdir) == ("tiny", "random", 40, "W")
    assert config.seq_len == PRESET_VALUES["tiny"]["seq_len"]
    assert config.resolved_tensorboard_dir == "W/tensorboard"


def test_yaml_file_sets_options_and_the_command_line_wins(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model: gemma3-1b\nseq_len: 512\nlr: 1.0e-4\nsamples: false\nmesh: {data: 2, fsdp: 4}\ndata: a.txt\n")
    config = parse_config(["--config", str(path), "--seq-len", "128"])
    assert (config.model, config.seq_len, config.lr, config.samples) == ("gemma3-1b", 128, 1e-4, False)
    assert config.mesh == {"data": 2, "fsdp": 4}


def test_every_flag_is_a_config_field_and_documented():
    fields = set(TrainConfig.__dataclass_fields__)
    for action in build_parser()._actions:
        if action.dest not in ("help", "config"):
            assert action.dest in fields and action.help, action.dest


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--preset", "tiny", "--seq-len", "0"], "argument --seq-len: expected a positive integer, got '0'"),
        (["--preset", "tiny", "--lr-schedule", "linear"], "argument --lr-schedule: invalid choice: 'linear'"),
        (["--preset", "tiny", "--mesh", "data=2,model=4"], "argument --mesh: expected AXIS=SIZE pairs over data, fsdp"),
        (["--preset", "tiny", "--eval-fraction", "1.5"], "argument --eval-fraction: expected a fraction in [0, 1)"),
        (["--preset", "tiny", "--bogus"], "unrecognized arguments: --bogus"),
        (["--model", "gemma3-1b"], "--data is required"),
        (["--preset", "tiny", "--weights", "official"], "--model tiny has no official weights"),
        (["--preset", "tiny", "--config", "/nonexistent.yaml"], "--config /nonexistent.yaml: file not found"),
        (["--preset", "tiny", "--local-checkpoint-interval", "0"],
         "argument --local-checkpoint-interval: expected auto or a positive number of steps, got '0'"),
        (["--preset", "tiny", "--local-checkpoint-dir", "gs://bucket/local"],
         "argument --local-checkpoint-dir: expected a directory on this host (host memory or a local disk), got "
         "'gs://bucket/local': a bucket is --checkpoint-dir's tier"),
        (["--preset", "tiny", "--workdir", "run", "--local-checkpoint-dir", "run/checkpoints/local"],
         "--local-checkpoint-dir run/checkpoints/local is inside --checkpoint-dir run/checkpoints: the local tier needs"),
    ],
)
def test_bad_flags_fail_with_one_line(capsys, argv, message):
    _fails(capsys, argv, message)


def test_unknown_yaml_keys_are_named(capsys, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("seq_len: 128\nlearning_rate: 0.1\nbatchsize: 4\n")
    _fails(capsys, ["--config", str(path)], f"--config {path}: unknown keys batchsize, learning_rate")


def test_bad_yaml_value_names_the_file(capsys, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("seq_len: many\n")
    _fails(capsys, ["--config", str(path)], f"--config {path}: argument --seq-len: expected an integer, got 'many'")


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "not found"),
        (b"", "no text in it"),
        (b"Once upon a time \xff\xfe there was a cat.<|endoftext|>", "UTF-8"),
    ],
)
def test_bad_data_files_fail_with_one_line(capsys, tmp_path, tokenizer_path, content, message):
    data = tmp_path / "stories.txt"
    if content is not None:
        data.write_bytes(content)
    argv = ["--model", "tiny", "--weights", "random", "--tokenizer", str(tokenizer_path), "--data", str(data),
            "--workdir", str(tmp_path / "run"), "--no-samples"]
    _fails(capsys, argv, message)


def test_weights_of_another_vocabulary_are_refused(capsys, tmp_path, corpus_path, tokenizer_path, prepared_dir):
    """A checkpoint trained with one tokenizer, fine-tuned again with a tokenizer of another size."""
    first = tmp_path / "first"
    assert main(["--model", "tiny", "--weights", "random", "--tokenizer", str(tokenizer_path), "--data", str(prepared_dir),
                 "--workdir", str(first), "--steps", "1", "--seq-len", "32", "--batch-size", "2", "--eval-fraction", "0",
                 "--no-samples"]) == contract.OK
    capsys.readouterr()
    other_tokenizer = train_tokenizer(corpus_path, tmp_path / "other.model", vocab_size=400)
    _fails(capsys, ["--model", "tiny", "--weights", str(first / "export" / "params"), "--tokenizer", str(other_tokenizer),
                    "--data", str(corpus_path), "--workdir", str(tmp_path / "second"), "--no-samples"],
           "does not fit the model: ['embedder']['input_embedding'] is (512, 128) in the checkpoint, the model needs (400, 128)")


def test_help_documents_the_command():
    result = subprocess.run([sys.executable, "-m", "trainer", "--help"], capture_output=True, text=True, check=True)
    for flag in ("--lora-rank", "--checkpoint-dir", "--mesh", "--samples, --no-samples", "--preset {tiny,tiny-chat,tiny-vision}",
                 "--data-format {auto,text,jsonl-text,jsonl-chat,", "--loss-on {completions,all}", "--on-bad-row {fail,skip}"):
        assert flag in result.stdout


def test_a_requested_platform_that_does_not_start_is_one_line_not_a_cpu_run(tmp_path):
    """The TPU pods set JAX_PLATFORMS=tpu: a pod whose TPU cannot be opened stops with exit 2 instead
    of training on the host's CPU (here: no TPU at all)."""
    env = {**os.environ, "JAX_PLATFORMS": "tpu"}
    done = subprocess.run([sys.executable, "-m", "trainer", "--preset", "tiny", "--workdir", str(tmp_path / "run")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == contract.USER_ERROR, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("trainer: error: environment variable JAX_PLATFORMS=tpu: "), done.stderr
    assert "TPU device files" in done.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_the_local_checkpoint_tier_is_off_by_default_and_its_interval_is_auto_or_steps():
    assert (parse_config(["--preset", "tiny"]).local_checkpoint_dir, TrainConfig().local_checkpoint_interval) == (None, "auto")
    config = parse_config(["--preset", "tiny", "--local-checkpoint-dir", "/dev/shm/ckpt", "--local-checkpoint-interval", "20"])
    assert (config.local_checkpoint_dir, config.local_checkpoint_interval) == ("/dev/shm/ckpt", "20")
