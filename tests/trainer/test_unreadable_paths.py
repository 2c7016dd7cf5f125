"""A gs:// --weights, --lora-weights or tokenizer that the run cannot read (no Google Cloud credentials, no
network) is one line naming the path and the fix, before any work: not gcsfs's tracebacks. The bucket is
a local stand-in (tests/gcs_stand_in.py)."""

import os
import subprocess
import sys

import jax
import pytest

from tests import gcs_stand_in
from tests.trainer.test_bad_inputs import REPO
from trainer import contract
from trainer.config import parse_config
from trainer.data.tokenizer import load_tokenizer
from trainer.errors import UserError
from trainer.model import models

KINDS = (gcs_stand_in.NO_CREDENTIALS, gcs_stand_in.NO_NETWORK)
REASONS = {gcs_stand_in.NO_CREDENTIALS: f"({gcs_stand_in.ANONYMOUS}, 401)", gcs_stand_in.NO_NETWORK: "(Cannot connect to host 127.0.0.1:"}
FIX = ("check the network and the Google Cloud credentials (`gcloud auth application-default login`; on GKE, a Workload "
       "Identity binding of the pod's service account), or copy the directory to a local disk and pass that")
WEIGHTS = "gs://team-bucket/gemma-3-1b"
ADAPTER = "gs://team-bucket/adapter"


def _config(*flags):
    return parse_config(["--model", "tiny", "--weights", "random", "--tokenizer", "t.model", "--data", "d", *flags])


def _one_line(error: UserError, what: str, path: str, kind: str) -> None:
    line = str(error)
    assert "\n" not in line
    assert line.startswith(f"{what} {path}: cannot read it {REASONS[kind]}"), line


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flags, what, path", [(("--weights", WEIGHTS), "--weights", WEIGHTS),
                                               (("--lora-rank", "4", "--lora-weights", ADAPTER), "--lora-weights", ADAPTER)])
def test_the_runs_check_of_its_weights_is_one_line(kind, flags, what, path, tmp_path):
    """models.check_weights, the trainer's first look at its weights (before any step is compiled)."""
    with gcs_stand_in.unreachable(kind, tmp_path), pytest.raises(UserError) as refused:
        models.check_weights(_config(*flags), models.model_config("tiny", vocab_size=512))
    _one_line(refused.value, what, path, kind)
    assert str(refused.value).endswith(FIX)


@pytest.mark.parametrize("flags, what, path", [(("--weights", WEIGHTS), "--weights", WEIGHTS),
                                               (("--lora-rank", "4", "--lora-weights", ADAPTER), "--lora-weights", ADAPTER)])
def test_loading_the_weights_is_one_line_too(flags, what, path, tmp_path):
    """Where the network goes between the check and the load: the load says it in one line as well."""
    config = _config(*flags)
    model_config = models.model_config("tiny", vocab_size=512)
    one_device = lambda tree: jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(jax.devices()[0]), tree)  # noqa: E731
    with gcs_stand_in.unreachable(gcs_stand_in.NO_NETWORK, tmp_path), pytest.raises(UserError) as refused:
        models.initial_params(config, model_config, one_device, resuming=False)
    _one_line(refused.value, what, path, gcs_stand_in.NO_NETWORK)


def test_a_tokenizer_on_gs_is_one_line_through_the_same_words(tmp_path):
    with gcs_stand_in.unreachable(gcs_stand_in.NO_CREDENTIALS, tmp_path), pytest.raises(UserError) as refused:
        load_tokenizer("gs://team-bucket/tokenizer.model")
    _one_line(refused.value, "tokenizer", "gs://team-bucket/tokenizer.model", gcs_stand_in.NO_CREDENTIALS)
    assert str(refused.value).endswith("or pass a local SentencePiece .model file")


def test_the_trainer_says_one_line_and_exits_2(tmp_path, tokenizer_path, prepared_dir):
    """`python -m trainer --weights gs://...` as the image runs it (gcsfs), without credentials: before, 36 lines
    of gcsfs's logged tracebacks and the trainer's own, exit 1."""
    with gcs_stand_in.endpoint(gcs_stand_in.NO_CREDENTIALS) as (url, requests):
        done = subprocess.run(
            [sys.executable, "-m", "trainer", "--model", "tiny", "--weights", WEIGHTS, "--tokenizer", str(tokenizer_path),
             "--data", str(prepared_dir), "--workdir", str(tmp_path / "run"), "--steps", "1", "--no-samples"],
            cwd=REPO, capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONPATH": str(REPO), **gcs_stand_in.environment(url, tmp_path)})
    assert requests, "the run did not ask the stand-in"
    assert (done.returncode, done.stdout) == (contract.USER_ERROR, "")
    assert "Traceback" not in done.stderr and "gcsfs" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == (f"trainer: error: --weights {WEIGHTS}: cannot read it ({gcs_stand_in.ANONYMOUS}, "
                                            f"401); {FIX}")
