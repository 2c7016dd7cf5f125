"""The gemma-tpu security rules as plain functions, and one evaluation over a whole resource graph.

`pack.py` wraps each rule in a pulumi_policy Policy; tests and tools call the rules directly.
"""

from collections.abc import Sequence
from typing import NamedTuple

from rules.base import Resource, ResourceRule, StackRule, Violation
from rules.gke import CLUSTER_WORKLOAD_IDENTITY, NODE_IDENTITY
from rules.iam import NO_PRIMITIVE_ROLES, NO_PROJECT_STORAGE_ROLES, NO_PUBLIC_MEMBERS, WORKLOAD_IDENTITY_BINDINGS
from rules.storage import BUCKET_ACCESS
from rules.workloads import IMAGES_FROM_STACK_REGISTRY, PODS_UNPRIVILEGED

RESOURCE_RULES: tuple[ResourceRule, ...] = (
    BUCKET_ACCESS,
    NO_PUBLIC_MEMBERS,
    NO_PRIMITIVE_ROLES,
    NO_PROJECT_STORAGE_ROLES,
    NODE_IDENTITY,
    CLUSTER_WORKLOAD_IDENTITY,
    WORKLOAD_IDENTITY_BINDINGS,
    PODS_UNPRIVILEGED,
)
STACK_RULES: tuple[StackRule, ...] = (IMAGES_FROM_STACK_REGISTRY,)


class Finding(NamedTuple):
    rule: str
    resource_type: str
    resource_name: str
    message: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.resource_type} {self.resource_name!r}: {self.message}"


def evaluate(resources: Sequence[Resource]) -> list[Finding]:
    """Every rule on every resource, as `pulumi preview --policy-pack` would run them."""
    findings = [
        Finding(rule.name, r.type, r.name, message)
        for r in resources
        for rule in RESOURCE_RULES
        for message in rule.check(r.type, r.props)
    ]
    findings += [
        Finding(rule.name, v.resource.type, v.resource.name, v.message)
        for rule in STACK_RULES
        for v in rule.check(resources)
    ]
    return findings


__all__ = ["RESOURCE_RULES", "STACK_RULES", "Finding", "Resource", "Violation", "evaluate"]
