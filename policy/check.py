"""Run the pack on an offline preview graph, as `pulumi preview --policy-pack policy` would:

    .venv/bin/python -m infra.preview --stack dev --json | .venv-policy/bin/python policy/check.py

Reads the JSON list of {"type", "name", "parent", "inputs"} from a file argument or stdin, prints
one line per violation and exits 1 if there is any. Values the preview marks "<computed>" are unknown
to the policies, as in a real preview: a rule that needs one is reported as not run, not as passed.
"""

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

from pulumi_policy import (
    Policy,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
)
from pulumi_policy.deserialize import deserialize_properties
from pulumi_policy.policy import PolicyCustomTimeouts
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, UnknownValueError, unknown_checking_proxy

from pack import policies

COMPUTED = "<computed>"  # how `infra.preview` prints a value only the cloud knows
USER_ERROR = 2
_OPTIONS = PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])


class Outcome(NamedTuple):
    violations: list[str]  # "[policy] TYPE 'NAME': message"
    not_run: list[str]  # "[policy] TYPE 'NAME': why", for values unknown before `pulumi up`


def _with_unknowns(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _with_unknowns(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_with_unknowns(item) for item in value]
    return UNKNOWN_STRING_VALUE if value == COMPUTED else value


def _engine_view(inputs: dict) -> Any:
    """Inputs as the engine hands them to a policy: secrets unwrapped, unknowns as its sentinel,
    behind its read-only proxy."""
    return unknown_checking_proxy(_with_unknowns(deserialize_properties(inputs)))


def _urn(entry: dict) -> str:
    return f"{entry['type']}::{entry['name']}"


def _label(urn: str | None) -> str:
    if not urn:
        return "the stack"
    resource_type, name = urn.split("::", 1)
    return f"{resource_type} {name!r}"


def _run(policy: Policy, args: Any, urn: str | None, outcome: Outcome) -> None:
    """Validate one resource (urn) or the whole stack (None), as the engine would."""

    def report(message: str, violating_urn: str | None = None) -> None:
        outcome.violations.append(f"[{policy.name}] {_label(violating_urn or urn)}: {message}")

    try:
        policy.validate(args, report)
    except UnknownValueError as unknown:
        outcome.not_run.append(f"[{policy.name}] {_label(urn)}: {unknown.message}")


def check_graph(entries: Sequence[dict]) -> Outcome:
    outcome = Outcome([], [])
    views = [(entry, _engine_view(entry.get("inputs") or {})) for entry in entries]
    for policy in policies():
        if isinstance(policy, ResourceValidationPolicy):
            for entry, props in views:
                args = ResourceValidationArgs(entry["type"], props, _urn(entry), entry["name"], _OPTIONS, None)
                _run(policy, args, _urn(entry), outcome)
        else:
            stack = [
                PolicyResource(entry["type"], props, _urn(entry), entry["name"], _OPTIONS, None, None, [], {})
                for entry, props in views
            ]
            _run(policy, StackValidationArgs(stack), None, outcome)
    return outcome


def _read_graph(path: str | None) -> list[dict]:
    source = path or "stdin"
    try:
        text = open(path, encoding="utf-8").read() if path else sys.stdin.read()
        graph = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{source}: cannot read a preview graph ({error}); produce one with "
                         "`python -m infra.preview --stack NAME --json`") from None
    if not isinstance(graph, list) or not all(isinstance(e, dict) and {"type", "name"} <= e.keys() for e in graph):
        raise ValueError(f"{source}: not a preview graph (a JSON list of {{type, name, parent, inputs}}); "
                         "produce one with `python -m infra.preview --stack NAME --json`")
    return graph


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="policy/check.py", description=__doc__.splitlines()[0])
    parser.add_argument("graph", nargs="?", help="preview JSON file (default: stdin)")
    args = parser.parse_args(argv)
    try:
        graph = _read_graph(args.graph)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return USER_ERROR
    outcome = check_graph(graph)
    for line in outcome.not_run:
        print(f"not run until `pulumi up`: {line}")
    for line in outcome.violations:
        print(f"violation: {line}")
    print(f"{len(graph)} resources, {len(policies())} policies: {len(outcome.violations)} violations")
    return 1 if outcome.violations else 0


if __name__ == "__main__":
    sys.exit(main())
