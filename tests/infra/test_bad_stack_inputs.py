"""Each bad stack input gives exit code 2, nothing on stdout and exactly one line on stderr that
names the key or file and the fix; docs/bad-inputs.md shows every case as the user gets it."""

import subprocess
import sys

import pytest

from infra.config.stack_files import PROJECT_ROOT
from infra.preview import main
from tests.infra.bad_stack_inputs import CASES, markdown_table

BY_NAME = {case.case: case for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=BY_NAME)
def test_bad_stack_input_is_one_line_and_exit_2(case, tmp_path, capsys):
    path = case.write(tmp_path)
    assert main(["--stack", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"error: {case.expected(path)}\n"


@pytest.mark.parametrize("name", ["not UTF-8 text", "unknown topology"])
def test_the_process_prints_no_traceback(name, tmp_path):
    """As a user runs it: a file problem, and a config problem the program itself finds under mocks."""
    case = BY_NAME[name]
    path = case.write(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "infra.preview", "--stack", str(path)],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120,
    )
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"error: {case.expected(path)}\n")


def test_the_document_shows_every_case():
    assert markdown_table() in (PROJECT_ROOT / "docs" / "bad-inputs.md").read_text()
