"""The rules as Pulumi runs them: wrapped in pulumi_policy policies, fed read-only proxies."""

import pytest
from pulumi_policy import EnforcementLevel, PolicyResource, PolicyResourceOptions, ResourceValidationArgs, StackValidationArgs
from pulumi_policy.policy import PolicyCustomTimeouts
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, UnknownValueError, unknown_checking_proxy

from pack import policies
from rules import RESOURCE_RULES, STACK_RULES

OPTIONS = PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])


def policy(name: str):
    return next(p for p in policies() if p.name == name)


def resource_args(entry: dict) -> ResourceValidationArgs:
    urn = f"urn:pulumi:dev::gemma-tpu::{entry['type']}::{entry['name']}"
    return ResourceValidationArgs(entry["type"], unknown_checking_proxy(entry["inputs"]), urn, entry["name"], OPTIONS, None)


def stack_args(entries: list[dict]) -> StackValidationArgs:
    return StackValidationArgs([
        PolicyResource(e["type"], unknown_checking_proxy(e["inputs"]), f"urn:{e['name']}", e["name"], OPTIONS, None,
                       None, [], {})
        for e in entries
    ])


def run(pulumi_policy, args) -> list[tuple[str, str | None]]:
    reported = []
    pulumi_policy.validate(args, lambda message, urn=None: reported.append((message, urn)))
    return reported


def test_every_rule_is_one_mandatory_policy_with_a_unique_name():
    names = [p.name for p in policies()]
    assert len(names) == len(set(names)) == len(RESOURCE_RULES) + len(STACK_RULES)
    assert all(p.enforcement_level == EnforcementLevel.MANDATORY for p in policies())


def test_every_resource_policy_passes_the_compliant_graph_through_the_proxies(compliant_graph):
    for p in policies()[: len(RESOURCE_RULES)]:
        for entry in compliant_graph:
            assert run(p, resource_args(entry)) == [], (p.name, entry["name"])


def test_a_violation_reaches_pulumi_with_its_message(graph_entry):
    bucket = graph_entry("data")
    bucket["inputs"]["publicAccessPrevention"] = "inherited"
    [(message, urn)] = run(policy("buckets-uniform-access-public-prevention"), resource_args(bucket))
    assert "publicAccessPrevention" in message and urn is None


def test_a_jobset_read_through_the_proxy_is_checked(graph_entry):
    jobset = graph_entry("train")
    jobset["inputs"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["hostNetwork"] = True
    [(message, _)] = run(policy("workload-pods-unprivileged"), resource_args(jobset))
    assert "hostNetwork" in message


def test_a_value_unknown_during_preview_is_not_taken_as_compliant(graph_entry):
    """Pulumi turns UnknownValueError into "can't run policy during preview"; it reruns at `up`."""
    member = graph_entry("trainer-wi")
    member["inputs"]["member"] = UNKNOWN_STRING_VALUE
    with pytest.raises(UnknownValueError):
        run(policy("workload-identity-binding-one-ksa"), resource_args(member))


def test_the_stack_policy_reports_the_offending_resource_urn(compliant_graph):
    assert run(policy("workload-images-from-stack-registry"), stack_args(compliant_graph)) == []
    job = next(e for e in compliant_graph if e["name"] == "prepare")
    job["inputs"]["spec"]["template"]["spec"]["containers"][0]["image"] = "docker.io/library/busybox"
    [(message, urn)] = run(policy("workload-images-from-stack-registry"), stack_args(compliant_graph))
    assert "docker.io/library/busybox" in message and urn == "urn:prepare"
