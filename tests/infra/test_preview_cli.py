"""`python -m infra.preview`: what a user reads before paying for TPUs."""

import json
import subprocess
import sys

from infra.config import PROJECT_ROOT
from infra.preview import main


def test_json_lists_every_resource_with_its_inputs(capsys):
    assert main(["--stack", "multislice", "--json"]) == 0
    resources = json.loads(capsys.readouterr().out)
    assert all(set(r) == {"type", "name", "parent", "inputs", "dependsOn"} for r in resources)
    pools = [r for r in resources if r["type"] == "gcp:container/nodePool:NodePool" and r["parent"] == "tpu"]
    assert [(p["inputs"]["nodeConfig"]["machineType"], p["inputs"]["placementPolicy"]) for p in pools] == [
        ("ct6e-standard-4t", {"type": "COMPACT", "tpuTopology": "2x4"})
    ] * 2


def test_text_shows_resources_and_stack_outputs(capsys):
    assert main(["--stack", "dev"]) == 0
    captured = capsys.readouterr()
    assert "gcp:container/nodePool:NodePool  tpu-slice-0  in tpu  provider gcp" in captured.out
    assert '"getCredentials": "gcloud container clusters get-credentials gemma-dev --location us-east5-b --project my-project"' in captured.out
    assert "gcp:project is not set for stack dev; previewing with 'my-project'" in captured.err


def test_invalid_config_exits_2_with_one_line(tmp_path):
    stack_file = tmp_path / "Pulumi.broken.yaml"
    stack_file.write_text("config:\n  gcp:project: acme-ml-123\n  gemma-tpu:tpu:\n    topology: 3x3\n")
    done = subprocess.run(
        [sys.executable, "-m", "infra.preview", "--stack", str(stack_file)],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "error: gemma-tpu:tpu.topology: topology '3x3' is not a v6e slice; "
        "choose one of 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16"
    ]


def test_unknown_stack_exits_2(capsys):
    assert main(["--stack", "staging"]) == 2
    assert "no stack file" in capsys.readouterr().err
