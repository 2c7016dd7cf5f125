"""Every path a run reads or writes on gs:// goes through one layer (trainer.storage): storage that cannot serve
it (no credentials, no such bucket, no network) is one line naming the path, the cause and the fix, before any
work, and without the storage libraries' logged tracebacks or a local folder named `gs:`. The bucket is a
local stand-in (tests/gcs_stand_in.py)."""

import os
import subprocess
import sys

import jax
import pytest

from tests import gcs_stand_in
from tests.trainer.test_bad_inputs import REPO
from trainer import contract, storage
from trainer.config import parse_config
from trainer.data.tokenizer import load_tokenizer
from trainer.errors import UserError
from trainer.goodput_report import main as goodput_main
from trainer.hf.publish import main as publish_main
from trainer.model import models
from trainer.run.checkpoint import Checkpointer

BUCKET = "team-bucket"
# What each kind of failure says after "cannot read it: " or "cannot write it: ", then (after the storage's
# own words, if any) the fix it gives.
CAUSES = {
    gcs_stand_in.NO_CREDENTIALS: ("Cloud Storage refused the credentials",
                                  "give this job credentials that may {doing} it: `gcloud auth application-default login` "
                                  "(on GKE, a Workload Identity binding of the pod's service account)"),
    gcs_stand_in.NO_BUCKET: (f"there is no bucket {BUCKET}",
                             f"create it (gcloud storage buckets create gs://{BUCKET}) or correct the path"),
    gcs_stand_in.NO_NETWORK: ("Cloud Storage did not answer", "check this machine's network (and proxy) to storage.googleapis.com"),
}
WORDS = {gcs_stand_in.NO_CREDENTIALS: f" ({gcs_stand_in.ANONYMOUS}, 401)",
         gcs_stand_in.NO_NETWORK: " (Cannot connect to host 127.0.0.1:"}
LOCAL_COPY = "copy it to a local disk and pass that"
SOME_FLAGS = ("--model", "tiny", "--weights", "random", "--tokenizer", "t.model", "--data", "d")


def _run_paths(field: str):
    """The trainer's check of its paths, before any work, with `field` (one of trainer.storage's RUN_INPUTS
    or RUN_FOLDERS) on gs://."""
    path = f"gs://{BUCKET}/{field}"
    extra = ("--lora-rank", "4") if field == "lora_weights" else ()
    config = parse_config([*SOME_FLAGS, *extra, "--" + field.replace("_", "-"), path])
    return lambda: storage.check_run_paths(config)


def _checkpointer():
    Checkpointer(f"gs://{BUCKET}/checkpoints", keep=1)


def _weights():
    config = parse_config([*SOME_FLAGS, "--weights", f"gs://{BUCKET}/weights"])
    models.check_weights(config, models.model_config("tiny", vocab_size=512))


def _cli(main, *argv):
    """A command's main: its one line is on stderr; the UserError the table expects is made of it."""
    def run():
        assert main(list(argv)) == contract.USER_ERROR
    return run


def _published_export(tmp_path):
    (tmp_path / "run" / "export" / "hf").mkdir(parents=True)
    (tmp_path / "run" / "export" / "hf" / "config.json").write_text("{}")
    return str(tmp_path / "run")


# name -> (what uses the path, the line's flag and path, read or write, what else the line offers).
PATHS = {
    **{f"trainer {field}": (_run_paths(field), f"--{field.replace('_', '-')} gs://{BUCKET}/{field}", storage.READ, LOCAL_COPY)
       for field in storage.RUN_INPUTS if field != "data"},
    **{f"trainer {field}": (_run_paths(field), f"--{field.replace('_', '-')} gs://{BUCKET}/{field}", storage.WRITE, "")
       for field, (_, buckets) in storage.RUN_FOLDERS.items() if buckets},
    "checkpoints": (_checkpointer, f"--checkpoint-dir gs://{BUCKET}/checkpoints", storage.WRITE, ""),
    "weights' check": (_weights, f"--weights gs://{BUCKET}/weights", storage.READ,
                       "copy the directory to a local disk and pass that"),
    "tokenizer": (lambda: load_tokenizer(f"gs://{BUCKET}/t.model"), f"tokenizer gs://{BUCKET}/t.model", storage.READ,
                  "pass a local SentencePiece .model file"),
    "goodput": (_cli(goodput_main, f"gs://{BUCKET}/run"), f"gs://{BUCKET}/run", storage.READ, ""),
    "publish": (None, f"--publish-dir gs://{BUCKET}/published", storage.WRITE, ""),
}


@pytest.mark.parametrize("kind", gcs_stand_in.KINDS)
@pytest.mark.parametrize("name", PATHS)
def test_storage_that_cannot_serve_a_path_is_one_line_naming_it_the_cause_and_the_fix(name, kind, tmp_path, monkeypatch,
                                                                                      capsys):
    use, named, doing, instead = PATHS[name]
    if name == "publish":
        use = _cli(publish_main, "--run", _published_export(tmp_path), "--publish-dir", f"gs://{BUCKET}/published")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.model").write_text("")  # SOME_FLAGS' local paths: there
    (tmp_path / "d").mkdir()
    with gcs_stand_in.unreachable(kind, tmp_path) as requests:
        try:
            use()
            line = capsys.readouterr().err.removesuffix("\n").partition("error: ")[2]
        except UserError as error:
            line = str(error)
    cause, fix = CAUSES[kind]
    assert "\n" not in line, line
    assert line.startswith(f"{named}: cannot {doing} it: {cause}{WORDS.get(kind, '')}"), line
    assert line.endswith(f"; {fix.format(doing=doing)}" + (f", or {instead}" if instead else "")), line
    assert requests or kind == gcs_stand_in.NO_NETWORK, "the stand-in was not asked"
    assert not (tmp_path / "gs:").exists()


def test_the_weights_load_after_the_check_is_one_line_too(tmp_path):
    """Where the network goes between the check and the load: the load says it in one line as well."""
    config = parse_config([*SOME_FLAGS, "--weights", f"gs://{BUCKET}/weights"])
    one_device = lambda tree: jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(jax.devices()[0]), tree)  # noqa: E731
    with gcs_stand_in.unreachable(gcs_stand_in.NO_NETWORK, tmp_path), pytest.raises(UserError) as refused:
        models.initial_params(config, models.model_config("tiny", vocab_size=512), one_device, resuming=False)
    assert str(refused.value).startswith(f"--weights gs://{BUCKET}/weights: cannot read it: Cloud Storage did not answer")


@pytest.mark.parametrize("error", [ConnectionRefusedError(), OSError("")])
def test_a_failure_without_a_message_still_gives_its_line(error):
    """An exception whose message is empty ended the publish folder's check with an IndexError."""
    with pytest.raises(UserError) as refused, storage.reading("--weights", "gs://b/w"):
        raise error
    assert str(refused.value).startswith("--weights gs://b/w: cannot read it")
    assert f"({type(error).__name__})" in str(refused.value)


def test_data_on_gs_is_refused_before_any_work(tmp_path):
    """The data is read as local files (ArrayRecord shards, a raw file prepared once): a gs:// path was taken
    for a local one (`./gs:/...`, not found)."""
    config = parse_config([*SOME_FLAGS, "--data", f"gs://{BUCKET}/stories.txt"])
    with pytest.raises(UserError, match=f"^--data gs://{BUCKET}/stories.txt: the data is a local file or folder"):
        storage.check_run_paths(config)


@pytest.mark.parametrize("flags, line", [
    # Taken for no value: --data '' trained the generated corpus, --lora-weights '' fresh adapters.
    (("--data", ""), f"--data '': empty; pass {storage.RUN_INPUTS['data']}"),
    (("--lora-rank", "4", "--lora-weights", ""), f"--lora-weights '': empty; pass {storage.RUN_INPUTS['lora_weights']}"),
    # Found missing only when the weights were loaded, after the data's preparation and the compile.
    (("--weights", "missing"), f"--weights missing: not found; pass {storage.RUN_INPUTS['weights']}"),
])
def test_an_empty_or_missing_input_is_one_line_before_any_work(flags, line, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.model").write_text("")
    (tmp_path / "d").mkdir()
    with pytest.raises(UserError) as refused:
        storage.check_run_paths(parse_config([*SOME_FLAGS, *flags]))
    assert str(refused.value) == line


def test_a_bug_inside_the_layer_is_no_storage_failure():
    with pytest.raises(KeyError), storage.writing("--checkpoint-dir", "gs://b/ck"):
        raise KeyError("a bug")


def _trainer(tmp_path, url, *flags):
    """`python -m trainer` as a user runs it where TensorFlow is installed (its gs:// is not asked for), gs://
    going to the stand-in at `url`."""
    environment = {**os.environ, "PYTHONPATH": str(REPO), **gcs_stand_in.environment(url, tmp_path)}
    del environment["EPATH_USE_TF"]
    return subprocess.run([sys.executable, "-m", "trainer", "--preset", "tiny", "--workdir", str(tmp_path / "run"),
                           "--steps", "1", "--no-samples", *flags],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=environment)


def test_a_checkpoint_folder_in_a_missing_bucket_is_one_line_before_any_work(tmp_path):
    """Before: 105 lines and four tracebacks, after the run had prepared its data."""
    with gcs_stand_in.endpoint(gcs_stand_in.NO_BUCKET) as (url, requests):
        done = _trainer(tmp_path, url, "--checkpoint-dir", "gs://no-such-bucket/ck")
    assert requests, "the run did not ask the stand-in"
    assert (done.returncode, done.stdout) == (contract.USER_ERROR, ""), done.stderr
    assert done.stderr == ("trainer: error: --checkpoint-dir gs://no-such-bucket/ck: cannot write it: there is no bucket "
                           "no-such-bucket; create it (gcloud storage buckets create gs://no-such-bucket) or correct the "
                           "path\n")
    assert not (tmp_path / "run").exists() and not (tmp_path / "gs:").exists()


def test_weights_without_credentials_are_one_line_without_gcsfs_log(tmp_path):
    """Before: 36 lines of gcsfs's logged tracebacks and the trainer's own, exit 1."""
    with gcs_stand_in.endpoint(gcs_stand_in.NO_CREDENTIALS) as (url, requests):
        done = _trainer(tmp_path, url, "--weights", f"gs://{BUCKET}/gemma-3-1b")
    assert requests, "the run did not ask the stand-in"
    assert (done.returncode, done.stdout) == (contract.USER_ERROR, ""), done.stderr
    cause, fix = CAUSES[gcs_stand_in.NO_CREDENTIALS]
    assert done.stderr == (f"trainer: error: --weights gs://{BUCKET}/gemma-3-1b: cannot read it: {cause}"
                           f"{WORDS[gcs_stand_in.NO_CREDENTIALS]}; {fix.format(doing='read')}, or {LOCAL_COPY}\n")
