"""`python -m infra.preview`: what a user reads before paying for TPUs."""

import json
import subprocess
import sys

from infra.config.stack_files import PROJECT_ROOT
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
    assert '"getCredentials": "gcloud container clusters get-credentials gemma-dev --location us-east5-b --project my-project --dns-endpoint"' in captured.out
    assert "gcp:project is not set for stack dev; previewing with 'my-project'" in captured.err


def test_unknown_stack_exits_2(capsys):
    assert main(["--stack", "staging"]) == 2
    assert "no stack file" in capsys.readouterr().err
