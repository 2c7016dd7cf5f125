"""`python -m workloads render`: the YAML a user reviews or applies with kubectl."""

import subprocess
import sys

import pytest
import yaml

from infra.cloud.checkpointing import checkpoint_configurations
from infra.queueing.queues import queue_objects
from tests.workloads.conftest import REPO, STACKS, stack_config
from trainer.contract import USER_ERROR
from workloads.__main__ import IMAGE_PLACEHOLDER, main, render_specs
from workloads.serving import stack_serving_objects


def test_render_multislice_writes_the_done_when_jobset(tmp_path, capsys):
    assert main(["render", "--stack", "multislice", "--out", str(tmp_path)]) == 0
    files = sorted(tmp_path.glob("*.yaml"))
    kinds = [yaml.safe_load(f.read_text())["kind"] for f in files]
    # The CheckpointConfiguration of GKE's multi-tier checkpointing (tests/workloads/test_schemas.py checks it with its CRD).
    assert kinds == ["Namespace", "ServiceAccount", "ServiceAccount", "CheckpointConfiguration", "Job", "JobSet"]
    jobset = yaml.safe_load(files[-1].read_text())
    (replicated,) = jobset["spec"]["replicatedJobs"]
    pod = replicated["template"]["spec"]["template"]["spec"]
    assert (replicated["replicas"], replicated["template"]["spec"]["parallelism"]) == (2, 2)
    assert pod["containers"][0]["resources"]["limits"]["google.com/tpu"] == "4"
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "2x4"
    assert jobset["metadata"]["annotations"]["alpha.jobset.sigs.k8s.io/exclusive-topology"] == "cloud.google.com/gke-nodepool"
    assert pod["containers"][0]["image"] == IMAGE_PLACEHOLDER  # the digest exists only after the build
    assert {"name": "local-checkpoints", "csi": {"driver": "multitier-checkpoint.csi.storage.gke.io"}} in pod["volumes"]
    assert "kubectl logs" in capsys.readouterr().out


@pytest.mark.parametrize("stack", STACKS)
def test_render_prints_plain_yaml_for_every_stack(stack, capsys):
    assert main(["render", "--stack", stack]) == 0
    text = capsys.readouterr().out
    assert "&id" not in text and "*id" not in text  # no YAML anchors for kubectl users to puzzle over
    kinds = [obj["kind"] for obj in yaml.safe_load_all(text)]
    config = stack_config(stack)
    datasets = {run.training.dataset for run in config.runs}
    kinds = kinds[: len(kinds) - len(stack_serving_objects(config, render_specs(config), None))]  # last: tests/workloads/test_serving.py
    # The namespace, 2 ServiceAccounts, multi-tier checkpointing's configuration, the queue, a preparation per
    # dataset and each run's training object.
    assert kinds[:3] == ["Namespace", "ServiceAccount", "ServiceAccount"]
    assert len(kinds) == 3 + len(checkpoint_configurations(config)) + len(queue_objects(config)) + len(datasets) + len(config.runs)
    assert kinds[-len(config.runs):] == ["Job" if run.slices * config.slice.hosts == 1 else "JobSet" for run in config.runs]


def test_invalid_config_exits_2_with_the_one_line_message(tmp_path):
    stack_file = tmp_path / "Pulumi.broken.yaml"
    stack_file.write_text("config:\n  gcp:project: my-project\n  gemma-tpu:tpu:\n    topology: 3x3\n")
    result = subprocess.run(
        [sys.executable, "-m", "workloads", "render", "--stack", str(stack_file)],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == USER_ERROR
    assert result.stderr.startswith("error: gemma-tpu:tpu.topology")
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
