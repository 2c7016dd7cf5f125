"""Every shipped stack's preview graph (`python -m infra.preview --stack NAME --json`, run with the
main venv's python: the Pulumi program's dependencies are not in this venv) passes every policy."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from check import check_graph

REPO_ROOT = Path(__file__).resolve().parents[2]
# The main virtualenv's python, which has the Pulumi program's dependencies (override: MAIN_PYTHON).
MAIN_PYTHON = Path(os.environ.get("MAIN_PYTHON", REPO_ROOT / ".venv" / "bin" / "python"))
PREVIEW_MODULE = REPO_ROOT / "infra" / "preview.py"
STACKS = sorted(path.name.removeprefix("Pulumi.").removesuffix(".yaml") for path in REPO_ROOT.glob("Pulumi.*.yaml"))
DOCUMENTED_STACKS = {"dev", "multihost", "multislice", "autopilot"}
# What the rules judge; a graph without these would pass for want of anything to check.
JUDGED_IN_EVERY_STACK = {
    "gcp:storage/bucket:Bucket",
    "gcp:container/cluster:Cluster",
    "gcp:serviceaccount/iAMMember:IAMMember",
    "gcp:artifactregistry/repository:Repository",
}

pytestmark = pytest.mark.skipif(
    not PREVIEW_MODULE.exists(), reason=f"{PREVIEW_MODULE.relative_to(REPO_ROOT)} does not exist yet (infra preview not landed)"
)


def preview_graph(stack: str) -> list[dict]:
    assert MAIN_PYTHON.exists(), f"{MAIN_PYTHON} not found: run `make setup`, or set MAIN_PYTHON to the main venv's python"
    result = subprocess.run(
        [str(MAIN_PYTHON), "-m", "infra.preview", "--stack", stack, "--json"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, f"infra.preview --stack {stack} failed:\n{result.stderr}"
    return json.loads(result.stdout)


def test_the_documented_stacks_are_shipped():
    assert DOCUMENTED_STACKS <= set(STACKS)


@pytest.mark.parametrize("stack", STACKS)
def test_the_stack_passes_every_policy(stack):
    graph = preview_graph(stack)
    assert JUDGED_IN_EVERY_STACK <= {entry["type"] for entry in graph}
    outcome = check_graph(graph)
    assert outcome.violations == [], "\n".join(outcome.violations)
    assert outcome.not_run == [], "\n".join(outcome.not_run)
