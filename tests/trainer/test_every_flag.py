"""Every flag of every command (the trainer, export, publish, goodput, supervise, and beside them `workloads
fit`, `workloads render` and `infra.preview`) with hostile values: a bad argument is one line and exit 2,
never a traceback (tests/cli_walk.py walks one command's parser)."""

import json
import os
import subprocess
import sys

import pytest

from tests.cli_walk import COMMANDS
from tests.trainer.test_bad_inputs import REPO


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_takes_hostile_values_without_a_traceback(command, tmp_path, tokenizer_path, prepared_dir):
    done = subprocess.run([sys.executable, "-m", "tests.cli_walk", command, str(tokenizer_path), str(prepared_dir),
                           str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    failures = json.loads(done.stdout.splitlines()[-1])
    assert failures == [], "\n".join(f"{case['flag']} {case['given']}: {case['got']}" for case in failures)
