"""Shared helpers: each shipped stack run once under Pulumi mocks, with a project set."""

import functools
from typing import Any

from infra.config.stack_files import read_stack_values
from infra.preview import Resource, StackPreview, preview

PROJECT_ID = "acme-ml-123"
SHIPPED_STACKS = ("dev", "multihost", "multislice", "autopilot", "queued", "serving")
STANDARD_STACKS = ("dev", "multihost", "multislice", "queued", "serving")


def stack_values(stack: str, **overrides: Any) -> dict[str, Any]:
    """A shipped stack's config with the user's project set, plus `overrides` (top-level keys)."""
    values, _ = read_stack_values(stack)
    return {**values, "gcp:project": PROJECT_ID, **overrides}


@functools.cache
def previewed(stack: str) -> StackPreview:
    return preview(stack_values(stack), stack)


def of_type(resources: list[Resource], type_: str) -> list[Resource]:
    return [r for r in resources if r.type == type_]


def one(resources: list[Resource], type_: str, name: str | None = None) -> Resource:
    matches = [r for r in of_type(resources, type_) if name is None or r.name == name]
    assert len(matches) == 1, f"expected one {type_} {name or ''}, found {[r.name for r in matches]}"
    return matches[0]
