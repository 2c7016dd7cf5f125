"""The two filter languages the stack's monitoring writes, as far as it uses them, parsed strictly:
a string that is not in the subset is an error here, so a typo cannot pass as a filter that matches
nothing.

- Monitoring filters (cloud.google.com/monitoring/api/v3/filters), of time series in the dashboard
  and the alert policies: `selector = value` terms joined by AND; a selector is `metric.type`,
  `resource.type`, `metric.label."K"`, `resource.label."K"` or `metadata.user_labels."K"`; a value a
  string or `one_of("a", ...)`.
- The Logging query language (cloud.google.com/logging/docs/view/logging-query-language), of the
  log-based metrics: `path = "v"`, `path =~ "RE2"` and `path:*` (the field exists) joined by AND,
  evaluated here against a log entry given as a dict, with the metrics' extractors `EXTRACT(path)`
  and `REGEXP_EXTRACT(path, "RE2")`.
"""

import re
from dataclasses import dataclass
from typing import Any

_STRING = r'"((?:[^"\\]|\\.)*)"'
_SELECTOR = re.compile(r'(metric\.type|resource\.type|(metric|resource)\.label|metadata\.user_labels)(?:\."([^"]+)")?')
_ONE_OF = re.compile(r"one_of\((.*)\)")
_PATH = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_LOG_TERM = re.compile(rf"({_PATH})\s*(?:(=~|=)\s*{_STRING}|(:\*))")


class FilterError(ValueError):
    pass


@dataclass(frozen=True)
class TimeSeriesFilter:
    metric_type: str
    resource_type: str
    resource_labels: dict[str, tuple[str, ...]]  # label -> the values it may have
    metric_labels: dict[str, tuple[str, ...]]
    node_labels: dict[str, tuple[str, ...]]  # metadata.user_labels


def parse_selector(text: str) -> tuple[str, str | None]:
    """`resource.label."pod_name"` -> ("resource.label", "pod_name"); also used for groupByFields."""
    match = _SELECTOR.fullmatch(text)
    if not match or (match.group(3) is None) != (match.group(1) in ("metric.type", "resource.type")):
        raise FilterError(f"not a selector: {text!r}")
    return match.group(1), match.group(3)


def parse_time_series_filter(text: str) -> TimeSeriesFilter:
    parts: dict[str, dict] = {"metric.type": {}, "resource.type": {}, "resource.label": {}, "metric.label": {},
                              "metadata.user_labels": {}}  # fmt: skip
    for term in text.split(" AND "):
        selector, _, value = term.partition(" = ")
        kind, name = parse_selector(selector)
        values = _values(value)
        key = name or kind
        if key in parts[kind]:
            raise FilterError(f"{selector} twice in {text!r}")
        parts[kind][key] = values
    if len(parts["metric.type"]) != 1 or len(parts["resource.type"]) != 1:
        raise FilterError(f"needs one metric.type and one resource.type: {text!r}")
    (metric_type,) = parts["metric.type"]["metric.type"]
    (resource_type,) = parts["resource.type"]["resource.type"]
    return TimeSeriesFilter(metric_type, resource_type, parts["resource.label"], parts["metric.label"],
                            parts["metadata.user_labels"])  # fmt: skip


def _values(text: str) -> tuple[str, ...]:
    single = re.fullmatch(_STRING, text)
    if single:
        return (single.group(1),)
    one_of = _ONE_OF.fullmatch(text)
    if one_of:
        items = [item.strip() for item in one_of.group(1).split(",")]
        if all(re.fullmatch(_STRING, item) for item in items):
            return tuple(re.fullmatch(_STRING, item).group(1) for item in items)
    raise FilterError(f"not a value: {text!r}")


@dataclass(frozen=True)
class LogTerm:
    path: str
    op: str  # "=", "=~" or ":*"
    value: str | None


def parse_log_filter(text: str) -> list[LogTerm]:
    terms = []
    for part in text.split(" AND "):
        match = _LOG_TERM.fullmatch(part.strip())
        if not match:
            raise FilterError(f"not a comparison of the subset: {part!r}")
        path, op, value, exists = match.groups()
        if op == "=~":
            re.compile(value)
        terms.append(LogTerm(path, op or exists, value))
    return terms


def field(entry: dict[str, Any], path: str) -> Any:
    """The log entry's field at a dotted path, or None."""
    value: Any = entry
    for name in path.split("."):
        if not isinstance(value, dict) or name not in value:
            return None
        value = value[name]
    return value


def matches(text: str, entry: dict[str, Any]) -> bool:
    for term in parse_log_filter(text):
        value = field(entry, term.path)
        if term.op == ":*":
            if value is None:
                return False
        elif term.op == "=":
            if value is None or str(value) != term.value:
                return False
        elif value is None or not re.search(term.value, str(value)):
            return False
    return True


def extract(extractor: str, entry: dict[str, Any]) -> Any:
    """What a log-based metric's value or label extractor gets from the entry (None: nothing)."""
    plain = re.fullmatch(rf"EXTRACT\(({_PATH})\)", extractor)
    if plain:
        return field(entry, plain.group(1))
    regexp = re.fullmatch(rf"REGEXP_EXTRACT\(({_PATH}), {_STRING}\)", extractor)
    if not regexp:
        raise FilterError(f"not an extractor: {extractor!r}")
    pattern = re.compile(regexp.group(2))
    if pattern.groups != 1:
        raise FilterError(f"REGEXP_EXTRACT needs one capture group: {extractor!r}")
    found = pattern.search(str(field(entry, regexp.group(1)) or ""))
    return found.group(1) if found else None
