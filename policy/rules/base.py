"""What a rule is: a plain function over one resource's inputs, or over every resource of a stack.

Rules never import pulumi_policy, so they run on hand-built dicts, on the JSON of
`python -m infra.preview --json`, and inside the pack (where props are read-only proxies that raise
on values unknown during preview; hence `Mapping`/`Sequence` checks rather than `dict`/`list`).
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple


class Resource(NamedTuple):
    type: str  # Pulumi type token, e.g. "gcp:storage/bucket:Bucket"
    name: str
    props: Mapping[str, Any]  # inputs, camelCase as the provider receives them
    urn: str = ""


class Violation(NamedTuple):
    """A stack rule's finding: what is wrong, and which resource it is about."""

    message: str
    resource: Resource


ResourceCheck = Callable[[str, Mapping[str, Any]], list[str]]
StackCheck = Callable[[Sequence[Resource]], list[Violation]]


@dataclass(frozen=True)
class ResourceRule:
    name: str
    description: str
    check: ResourceCheck  # (type token, props) -> one message per violation


@dataclass(frozen=True)
class StackRule:
    name: str
    description: str
    check: StackCheck


def is_mapping(value: Any) -> bool:
    return isinstance(value, Mapping)


def as_list(value: Any) -> list[Any]:
    """A Pulumi list input as a list; a missing value (or a scalar) as an empty one."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        return list(value)
    return []


def dig(props: Any, *keys: str) -> Any:
    """props[k1][k2]... or None where a level is missing or not an object."""
    for key in keys:
        if not is_mapping(props):
            return None
        props = props.get(key)
    return props
