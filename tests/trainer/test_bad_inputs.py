"""Each bad trainer input gives exit code 2 and exactly one line on stderr that names the flag or file
and the fix, and leaves nothing in the run directory that a later run would take for valid output;
docs/bad-inputs.md shows every case as the user gets it."""

import os
import pathlib
import subprocess
import sys
from contextlib import nullcontext

import pytest

from tests import gcs_stand_in
from tests.trainer.bad_inputs import CASES, OPEN_END, markdown_sections
from trainer import contract
from trainer.__main__ import main
from trainer.data.prepare import META_FILE
from trainer.run.metrics import METRICS_FILE

REPO = pathlib.Path(__file__).parents[2]
BY_NAME = {case.case: case for case in CASES}


@pytest.fixture(scope="module")
def provided(tmp_path_factory, corpus_path, tokenizer_path, prepared_dir) -> dict[str, pathlib.Path]:
    """What some cases link into their folder, built once (see BadRun.provided)."""
    from sentencepiece import sentencepiece_model_pb2

    from trainer.data.tokenizer import train_tokenizer

    folder = tmp_path_factory.mktemp("bad_inputs_provided")
    huge = sentencepiece_model_pb2.ModelProto.FromString(pathlib.Path(tokenizer_path).read_bytes())
    for number in range(262_145 - len(huge.pieces)):  # one more piece than Gemma 3 has embeddings
        huge.pieces.add(piece=f"\u2581extra{number}", score=-100.0 - number * 1e-3)
    (folder / "huge.model").write_bytes(huge.SerializeToString())
    first = folder / "first"
    assert main(["--model", "tiny", "--weights", "random", "--tokenizer", str(tokenizer_path), "--data", str(prepared_dir),
                 "--workdir", str(first), "--steps", "1", "--seq-len", "32", "--batch-size", "4", "--eval-fraction", "0",
                 "--no-samples"]) == contract.OK
    return {
        "a tokenizer of 400 pieces": train_tokenizer(corpus_path, folder / "other.model", vocab_size=400),
        "a tokenizer of 262,145 pieces": folder / "huge.model",
        "a finished run with tokenizer.model": first,
    }


def _case_folder(case, folder: pathlib.Path, provided, tokenizer_path, prepared_dir) -> pathlib.Path:
    (folder / "tokenizer.model").symlink_to(tokenizer_path)
    (folder / "prepared").symlink_to(prepared_dir)
    for name, content in case.files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)
    for name, what in case.provided.items():
        (folder / name).symlink_to(provided[what])
    return folder


def _valid_looking(run: pathlib.Path) -> list[str]:
    """What a later run or a user would take for results: checkpoints, an export, metrics records, a
    loss plot, a data cache without its meta.json (trainer.data.prepare renames a cache into place when complete)."""
    found = [str(path.relative_to(run)) for pattern in ("checkpoints/*", "export", "loss.png") for path in run.glob(pattern)]
    metrics = run / METRICS_FILE
    if metrics.exists() and metrics.read_text().strip():
        found.append(METRICS_FILE)
    found += [str(cache.relative_to(run)) for cache in run.glob("data_cache/*") if not (cache / META_FILE).is_file()]
    return found


def _check_line(err: str, case) -> None:
    expected = case.error
    assert err.count("\n") == 1 and "Traceback" not in err, err
    if expected.endswith(OPEN_END):
        assert err.startswith(f"trainer: error: {expected.removesuffix(OPEN_END)}"), err
    else:
        assert err == f"trainer: error: {expected}\n"


@pytest.mark.parametrize("case", CASES, ids=BY_NAME)
def test_bad_input_is_one_line_exit_2_and_leaves_nothing_valid_looking(case, tmp_path, monkeypatch, capsys, provided,
                                                                       tokenizer_path, prepared_dir):
    folder = _case_folder(case, tmp_path, provided, tokenizer_path, prepared_dir)
    monkeypatch.chdir(folder)
    gcs = gcs_stand_in.unreachable(case.gcs, tmp_path) if case.gcs else nullcontext()
    with gcs:
        assert main(case.argv()) == contract.USER_ERROR
    captured = capsys.readouterr()
    _check_line(captured.err, case)
    assert captured.out == ""
    assert _valid_looking(folder / "run") == []


@pytest.mark.parametrize("name", ["unknown flag", "Latin-1 text"])
def test_the_process_prints_no_traceback(name, tmp_path, provided, tokenizer_path, prepared_dir):
    """As a user runs it: a flag the parser refuses, and a data file the run refuses after JAX has loaded."""
    case = BY_NAME[name]
    folder = _case_folder(case, tmp_path, provided, tokenizer_path, prepared_dir)
    done = subprocess.run([sys.executable, "-m", "trainer", *case.argv()], cwd=folder, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (done.returncode, done.stdout) == (contract.USER_ERROR, "")
    assert "Traceback" not in done.stderr, done.stderr
    # TensorFlow's C++ logging (imported by gemma) may say a line or two first; ours is the last.
    _check_line(done.stderr.splitlines(keepends=True)[-1], case)


def test_the_document_shows_every_case():
    assert markdown_sections() in (REPO / "docs" / "bad-inputs.md").read_text()
