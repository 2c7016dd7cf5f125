"""Every shipped stack's preview graph (`python -m infra.preview --stack NAME --json`, run with the
main venv's python: the Pulumi program's dependencies are not in this venv) passes every policy."""

import functools
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from check import check_graph
from rules import Resource
from rules.workloads import registry_prefixes

REPO_ROOT = Path(__file__).resolve().parents[2]
# The main virtualenv's python, which has the Pulumi program's dependencies (override: MAIN_PYTHON,
# relative to where pytest runs). absolute(), not resolve(): the venv's python is a symlink.
MAIN_PYTHON = Path(os.environ.get("MAIN_PYTHON", REPO_ROOT / ".venv" / "bin" / "python")).absolute()
# Run as a module: were the preview to move, every test here fails with the import error; none skips.
PREVIEW_MODULE = "infra.preview"
STACKS = sorted(path.name.removeprefix("Pulumi.").removesuffix(".yaml") for path in REPO_ROOT.glob("Pulumi.*.yaml"))
DOCUMENTED_STACKS = {"dev", "multihost", "multislice", "autopilot"}
# What the rules judge; a graph without these would pass for want of anything to check.
JUDGED_IN_EVERY_STACK = {
    "gcp:storage/bucket:Bucket",
    "gcp:container/cluster:Cluster",
    "gcp:serviceaccount/iAMMember:IAMMember",
    "gcp:artifactregistry/repository:Repository",
    "docker-build:index:Image",
    "kubernetes:batch/v1:Job",  # data preparation; training is a Job or a JobSet
}
# A prebuilt `gemma-tpu:image` takes another path into the pods than the built one; one stack
# with a training Job and one with a JobSet cover it.
PREBUILT_IMAGE_STACKS = ["dev", "multislice"]

def preview_graph(stack: str) -> list[dict]:
    """The graph of a shipped stack (by name) or of a stack file (by path)."""
    assert MAIN_PYTHON.exists(), f"{MAIN_PYTHON} not found: run `make setup`, or set MAIN_PYTHON to the main venv's python"
    result = subprocess.run(
        [str(MAIN_PYTHON), "-m", PREVIEW_MODULE, "--stack", stack, "--json"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, f"{PREVIEW_MODULE} --stack {stack} failed:\n{result.stderr}"
    return json.loads(result.stdout)


@functools.cache
def shipped_graph(stack: str) -> tuple[dict, ...]:
    return tuple(preview_graph(stack))


def test_the_documented_stacks_are_shipped():
    assert DOCUMENTED_STACKS <= set(STACKS)


@pytest.mark.parametrize("stack", STACKS)
def test_the_shipped_stack_passes_every_policy(stack):
    graph = list(shipped_graph(stack))
    assert JUDGED_IN_EVERY_STACK <= {entry["type"] for entry in graph}
    outcome = check_graph(graph)
    assert outcome.violations == [], "\n".join(outcome.violations)
    # The preview fills in the pushed image's reference, so nothing is left for `pulumi up`.
    assert outcome.not_run == [], "\n".join(outcome.not_run)


@pytest.mark.parametrize("stack", PREBUILT_IMAGE_STACKS)
def test_the_stack_with_a_prebuilt_image_in_its_registry_passes(stack, tmp_path):
    """`gemma-tpu:image` set to an image already in the stack's repository: nothing is built."""
    resources = [Resource(e["type"], e["name"], e["inputs"]) for e in shipped_graph(stack)]
    [repository] = registry_prefixes(resources)
    stack_file = tmp_path / f"Pulumi.{stack}.yaml"
    document = yaml.safe_load((REPO_ROOT / f"Pulumi.{stack}.yaml").read_text())
    document["config"]["gemma-tpu:image"] = f"{repository}trainer:prebuilt"
    stack_file.write_text(yaml.safe_dump(document))
    graph = preview_graph(str(stack_file))
    assert "docker-build:index:Image" not in {entry["type"] for entry in graph}
    outcome = check_graph(graph)
    assert outcome.violations == [], "\n".join(outcome.violations)
    assert outcome.not_run == [], "\n".join(outcome.not_run)
