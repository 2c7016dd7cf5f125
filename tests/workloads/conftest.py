"""Fixtures for the workload tests: stack configs (shipped or edited), run specs, a Pulumi mock
runtime that records registrations, and the strict schema validators."""

import os
import pathlib
from typing import Any, Callable

import pulumi
import pytest

from infra.config import StackConfig, parse_stack_config
from infra.preview import Registration, record
from infra.config.stack_files import offline_values, shipped_stacks
from workloads.spec import RunSpec, run_spec

REPO = pathlib.Path(__file__).resolve().parents[2]
# ../shared/schemas beside the repository on the project's machines and in CI.
SCHEMAS_ENV = "GEMMA_TPU_SCHEMAS"
IMAGE = "us-east5-docker.pkg.dev/my-project/gemma-dev/trainer:0123456789abcdef@sha256:" + "0" * 64
STACKS = shipped_stacks()


def stack_values(stack: str) -> dict[str, Any]:
    """The `config:` section of a shipped stack file, with the offline placeholder project."""
    return offline_values(stack)[0]


def edited_config(stack: str, **sections: Any) -> StackConfig:
    """A shipped stack with some `gemma-tpu:<section>` keys changed, e.g. tpu={"slices": 3}, or
    top-level `gemma-tpu:` keys set, e.g. protect=True."""
    values = stack_values(stack)
    for section, changes in sections.items():
        key = f"gemma-tpu:{section}"
        values[key] = {**(values.get(key) or {}), **changes} if isinstance(changes, dict) else changes
    return parse_stack_config(values, stack)


def stack_config(stack: str) -> StackConfig:
    return parse_stack_config(stack_values(stack), stack)


def spec_of(config: StackConfig, image: str = IMAGE) -> RunSpec:
    """The stack's first run (a stack without gemma-tpu:runs has only that one)."""
    return run_spec(config, config.runs[0], image=image)


def training_pod(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod template of a training Job or of a JobSet's (only) replicated Job."""
    if obj["kind"] == "Job":
        return obj["spec"]["template"]
    (replicated,) = obj["spec"]["replicatedJobs"]
    return replicated["template"]["spec"]["template"]


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"] if c["name"] == name]
    return found


def schemas_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get(SCHEMAS_ENV, REPO.parent / "shared" / "schemas"))


class _EchoMocks(pulumi.runtime.Mocks):
    """Every resource's state is its inputs; invokes return a fake access token."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {"accessToken": "fake-token"}


@pytest.fixture
def pulumi_mocks() -> Callable[[Callable[[], Any]], list[Registration]]:
    """Runs `program` under a fresh Pulumi mock runtime; returns every registration, in order."""
    return lambda program: record(program, _EchoMocks(), stack="test", preview=False)
