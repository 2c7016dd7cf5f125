"""The rules as Pulumi runs them: wrapped in pulumi_policy policies (pack.py) and fed the engine's
read-only proxies, with "<computed>" values unknown (check.py)."""

import json

from pulumi_policy import EnforcementLevel

from check import COMPUTED, check_graph, main
from pack import policies
from rules import RESOURCE_RULES, STACK_RULES


def entry_named(graph: list[dict], name: str) -> dict:
    return next(e for e in graph if e["name"] == name)


def test_every_rule_is_one_mandatory_policy_with_a_unique_name():
    names = [p.name for p in policies()]
    assert len(names) == len(set(names)) == len(RESOURCE_RULES) + len(STACK_RULES)
    assert all(p.enforcement_level == EnforcementLevel.MANDATORY for p in policies())


def test_the_compliant_graph_passes_every_policy(compliant_graph):
    assert check_graph(compliant_graph) == ([], [])


def test_a_resource_violation_names_policy_resource_and_field(compliant_graph):
    entry_named(compliant_graph, "data")["inputs"]["publicAccessPrevention"] = "inherited"
    [violation] = check_graph(compliant_graph).violations
    assert violation.startswith("[buckets-uniform-access-public-prevention] gcp:storage/bucket:Bucket 'data': ")
    assert "publicAccessPrevention" in violation


def test_a_jobset_read_through_the_proxies_is_checked(compliant_graph):
    train = entry_named(compliant_graph, "train")["inputs"]
    train["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["hostNetwork"] = True
    [violation] = check_graph(compliant_graph).violations
    assert violation.startswith("[workload-pods-unprivileged] ") and "hostNetwork" in violation


def test_a_value_unknown_before_up_is_not_taken_as_compliant(compliant_graph):
    entry_named(compliant_graph, "trainer-wi")["inputs"]["member"] = COMPUTED
    outcome = check_graph(compliant_graph)
    assert outcome.violations == []
    assert {line.split("]")[0] for line in outcome.not_run} == {"[no-public-iam-members", "[workload-identity-binding-one-ksa"}


def test_a_rule_that_needs_no_unknown_value_still_runs(compliant_graph):
    """A new service account's email is unknown during preview; its roles are not."""
    log_writer = entry_named(compliant_graph, "nodes-log-writer")["inputs"]
    log_writer["member"], log_writer["role"] = COMPUTED, "roles/editor"
    outcome = check_graph(compliant_graph)
    assert [line.split("]")[0] for line in outcome.violations] == ["[no-primitive-roles"]
    assert [line.split("]")[0] for line in outcome.not_run] == ["[no-public-iam-members"]


def test_the_stack_policy_names_the_offending_resource(compliant_graph):
    prepare = entry_named(compliant_graph, "prepare")["inputs"]
    prepare["spec"]["template"]["spec"]["containers"][0]["image"] = "docker.io/library/busybox"
    [violation] = check_graph(compliant_graph).violations
    assert violation.startswith("[workload-images-from-stack-registry] kubernetes:batch/v1:Job 'prepare': ")


def test_the_command_exits_by_outcome(tmp_path, compliant_graph, capsys):
    graph = tmp_path / "graph.json"
    graph.write_text(json.dumps(compliant_graph))
    assert main([str(graph)]) == 0
    entry_named(compliant_graph, "data")["inputs"]["uniformBucketLevelAccess"] = False
    graph.write_text(json.dumps(compliant_graph))
    assert main([str(graph)]) == 1
    assert "violation: [buckets-uniform-access-public-prevention]" in capsys.readouterr().out


def test_the_command_rejects_a_file_that_is_not_a_graph_in_one_line(tmp_path, capsys):
    for text in ("{not json", json.dumps({"type": "x"}), json.dumps([{"name": "no type"}])):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        assert main([str(bad)]) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and "bad.json" in error and "infra.preview" in error


def test_an_image_unknown_before_up_leaves_the_stack_policy_not_run(compliant_graph):
    prepare = entry_named(compliant_graph, "prepare")["inputs"]
    prepare["spec"]["template"]["spec"]["containers"][0]["image"] = COMPUTED
    outcome = check_graph(compliant_graph)
    assert outcome.violations == []
    assert outcome.not_run == [
        "[workload-images-from-stack-registry] the stack: string value at "
        ".spec.template.spec.containers.0.image can't be known during preview"
    ]


def test_secret_inputs_are_judged_by_their_value(compliant_graph):
    """The preview prints a secret in its wire form; the engine hands policies the plain value."""
    secret_sig, secret = "4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270"
    entry_named(compliant_graph, "nodes-log-writer")["inputs"]["member"] = {secret_sig: secret, "value": "allUsers"}
    [violation] = check_graph(compliant_graph).violations
    assert violation.startswith("[no-public-iam-members] ") and "allUsers" in violation
