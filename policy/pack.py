"""The rules as pulumi_policy policies. Every one is mandatory: a violation stops `pulumi preview`
and `pulumi up` (a user may lower one with `--policy-pack-config`)."""

from pulumi_policy import (
    EnforcementLevel,
    Policy,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from rules import RESOURCE_RULES, STACK_RULES, Resource
from rules.base import ResourceRule, StackRule

PACK_NAME = "gemma-tpu-security"
DESCRIPTION = "Security rules for the gemma-tpu stacks: storage, IAM, GKE identity, workload pods and images."


def resource_policy(rule: ResourceRule) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        for message in rule.check(args.resource_type, args.props):
            report_violation(message, None)

    return ResourceValidationPolicy(
        name=rule.name,
        description=rule.description,
        validate=validate,
        enforcement_level=EnforcementLevel.MANDATORY,
    )


def stack_policy(rule: StackRule) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        resources = [Resource(r.resource_type, r.name, r.props, r.urn) for r in args.resources]
        for violation in rule.check(resources):
            report_violation(violation.message, violation.resource.urn or None)

    return StackValidationPolicy(
        name=rule.name,
        description=rule.description,
        validate=validate,
        enforcement_level=EnforcementLevel.MANDATORY,
    )


def policies() -> list[Policy]:
    return [resource_policy(r) for r in RESOURCE_RULES] + [stack_policy(r) for r in STACK_RULES]
