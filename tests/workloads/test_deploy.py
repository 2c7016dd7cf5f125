"""The Pulumi side: TrainingRun applies the builders' dicts through the given provider, in order,
and TrainerImage builds from trainer/ (or uses the configured image), under Pulumi mocks."""

import dataclasses
import pathlib

import pulumi
import pulumi_kubernetes as k8s
import pytest
from pulumi.runtime import rpc

from infra.cloud.image import TRAINER_DIR, TrainerImage, source_tag
from infra.queueing.jobset import JOBSET_MANIFESTS
from tests.workloads.conftest import IMAGE, spec_of, stack_config
from workloads import manifests, preparation
from workloads.deploy import RunPlatform, TrainingRun
from trainer.contract import TRAINER_UID
from workloads.spec import PREPARE_DEADLINE_SECONDS

JOB = "kubernetes:batch/v1:Job"
JOBSET = "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet"


def _platform_and_run(config, outputs: dict):
    """The resources TrainingRun is given by the program (a provider, namespace, both
    ServiceAccounts, the JobSet install, a TPU pool), then the run itself; its outputs are
    collected into `outputs`."""

    def program():
        provider = k8s.Provider("cluster", kubeconfig="{}")
        on_cluster = pulumi.ResourceOptions(provider=provider)
        namespace = k8s.core.v1.Namespace("namespace", metadata={"name": config.namespace}, opts=on_cluster)
        account, preparation_account = (
            k8s.core.v1.ServiceAccount(label, metadata={"name": name, "namespace": config.namespace}, opts=on_cluster)
            for label, name in (("service-account", config.service_account), ("preparation-account", config.preparation_service_account))
        )
        jobset = k8s.yaml.v2.ConfigFile("jobset", file=JOBSET_MANIFESTS, opts=on_cluster)
        tpu_pool = pulumi.CustomResource("test:index:TpuPool", "tpu-pool")
        platform = RunPlatform(
            provider=provider, namespace=namespace, service_account=account, preparation_service_account=preparation_account,
            jobset_install=jobset, training_after=[tpu_pool],
        )  # fmt: skip
        run = TrainingRun("run", config=config, run=config.runs[0], image=IMAGE, platform=platform)
        return pulumi.Output.all(run.logs_command, run.status_command, run.tensorboard_dir).apply(
            lambda values: outputs.update(zip(("logs", "status", "tensorboard"), values))
        )

    return program


@pytest.mark.parametrize(("stack", "training_type"), [("dev", JOB), ("multislice", JOBSET)])
def test_run_is_applied_by_the_cluster_provider_after_its_prerequisites(pulumi_mocks, stack, training_type):
    config = stack_config(stack)
    outputs: dict = {}
    registrations = pulumi_mocks(_platform_and_run(config, outputs))
    by_name = {r.name: r for r in registrations}
    provider, prepare, training = by_name["cluster"], by_name["prepare-data"], by_name["training"]
    assert (prepare.type, training.type) == (JOB, training_type)
    for resource in (prepare, training):
        assert resource.provider_urn == provider.urn
        assert resource.parent_urn == by_name["run"].urn
    assert {by_name["namespace"].urn, by_name["preparation-account"].urn} <= set(prepare.dependency_urns)
    assert by_name["tpu-pool"].urn not in prepare.dependency_urns  # data preparation runs on CPU nodes
    assert {prepare.urn, by_name["jobset"].urn, by_name["service-account"].urn, by_name["tpu-pool"].urn} <= set(training.dependency_urns)
    assert prepare.custom_timeouts.create == f"{PREPARE_DEADLINE_SECONDS}s"

    spec = spec_of(config)
    expected = manifests.training(spec)
    assert training.inputs["metadata"] == expected["metadata"]
    assert training.inputs["spec"] == expected["spec"]
    assert prepare.inputs["spec"] == preparation.preparation_job(spec)["spec"]
    assert outputs == {
        "logs": manifests.logs_command(spec),
        "status": manifests.status_command(spec),
        "tensorboard": f"gs://{config.artifacts_bucket}/runs/{spec.name}/tensorboard",
    }


def test_a_long_training_job_does_not_block_pulumi_up_but_preparation_is_awaited(pulumi_mocks):
    registrations = pulumi_mocks(_platform_and_run(stack_config("dev"), {}))
    by_name = {r.name: r for r in registrations}
    assert by_name["training"].inputs["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    assert "pulumi.com/skipAwait" not in by_name["prepare-data"].inputs["metadata"].get("annotations", {})


def _image_program(config, refs: list):
    def program():
        image = TrainerImage("trainer", config=config, repository_url="us-east5-docker.pkg.dev/my-project/gemma-dev")
        return image.ref.apply(refs.append)

    return program


def test_image_is_built_from_trainer_sources_and_pushed_with_a_secret_token(pulumi_mocks):
    registrations = pulumi_mocks(_image_program(stack_config("dev"), []))
    (build,) = [r for r in registrations if r.type == "docker-build:index:Image"]
    inputs = build.inputs
    assert inputs["push"] is True and inputs["buildOnPreview"] is False
    assert inputs["tags"] == [f"us-east5-docker.pkg.dev/my-project/gemma-dev/trainer:{source_tag()}"]
    assert pathlib.Path(inputs["context"]["location"]) == TRAINER_DIR
    assert inputs["buildArgs"] == {"TRAINER_UID": str(TRAINER_UID)}
    # The access token makes the registry login a secret: it reaches the engine wrapped as one.
    registries = inputs["registries"]
    assert rpc._special_secret_sig in registries.values()
    (registry,) = registries["value"]
    assert registry == {"address": "us-east5-docker.pkg.dev", "username": "oauth2accesstoken", "password": "fake-token"}


def test_a_configured_image_is_used_as_is_and_nothing_is_built(pulumi_mocks):
    configured = dataclasses.replace(stack_config("dev"), image="ghcr.io/me/trainer:1")
    refs: list = []
    registrations = pulumi_mocks(_image_program(configured, refs))
    assert not [r for r in registrations if r.type == "docker-build:index:Image"]
    assert refs == ["ghcr.io/me/trainer:1"]


def test_source_tag_follows_the_build_context_and_its_dockerignore(tmp_path):
    (tmp_path / ".dockerignore").write_text("**/__pycache__\n*.log\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("print('a')\n")
    tag = source_tag(tmp_path)
    assert source_tag(tmp_path) == tag and len(tag) == 16
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "train.cpython-312.pyc").write_bytes(b"\0")
    (tmp_path / "build.log").write_text("noise")
    assert source_tag(tmp_path) == tag  # ignored files do not trigger a rebuild
    (tmp_path / "pkg" / "train.py").write_text("print('b')\n")
    assert source_tag(tmp_path) != tag
