"""Where a stack's config comes from: `Pulumi.<stack>.yaml` files (preview, render, tests, the
stack table) or the Pulumi engine (`from_pulumi`, the program); `infra.config` validates it.

Offline readers that need a project (bucket and account names derive from it) fill a missing
`gcp:project` with PLACEHOLDER_PROJECT through `offline_values`, and say so.
"""

import json
import sys
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import yaml

from infra.config import StackConfig, parse_stack_config
from infra.errors import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # where Pulumi.yaml and the stack files live
PLACEHOLDER_PROJECT = "my-project"  # the shipped stack files leave gcp:project to the user


def stack_file(stack: str) -> Path:
    return PROJECT_ROOT / f"Pulumi.{stack}.yaml"


def shipped_stacks() -> tuple[str, ...]:
    return tuple(sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in PROJECT_ROOT.glob("Pulumi.*.yaml")))


def read_stack_values(path_or_stack_name: str | Path) -> tuple[dict[str, Any], str]:
    """The `config:` section of a stack file and the stack's name, from a path or a stack name."""
    path = Path(path_or_stack_name)
    if path.suffix not in (".yaml", ".yml"):
        path = stack_file(str(path_or_stack_name))
    if not path.is_file():
        raise ConfigError(f"no stack file {path}; the stacks here are {', '.join(shipped_stacks())}")
    try:
        document = yaml.load(path.read_text(encoding="utf-8"), Loader=_StackFileLoader) or {}
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text; save the stack file as UTF-8 YAML") from None
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}; check the file's permissions") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {_yaml_problem(error)}") from None
    if not isinstance(document, Mapping):
        raise ConfigError(f"{path} must be a mapping with a `config:` section")
    values = document.get("config") or {}
    if not isinstance(values, Mapping):
        raise ConfigError(f"the `config:` section of {path} must be a mapping of keys to values, got {values!r}")
    _reject_encrypted(path, values)
    return {str(key): value for key, value in values.items()}, path.name.removeprefix("Pulumi.").rsplit(".", 1)[0]


class _StackFileLoader(yaml.SafeLoader):
    """YAML that refuses a key set twice in one mapping (plain YAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue  # SafeLoader reports an unhashable key itself
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"{key!r} is set twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _yaml_problem(error: yaml.YAMLError) -> str:
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    mark = getattr(error, "problem_mark", None)
    return f"line {mark.line + 1}: {problem}; correct that line" if mark else problem


def _reject_encrypted(path: Path, values: Mapping[Any, Any], prefix: str = "") -> None:
    """`pulumi config set --secret` stores `{secure: ...}`, which only the Pulumi CLI can decrypt."""
    for name, value in values.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping) and set(value) == {"secure"}:
            raise ConfigError(
                f"{key} is encrypted in {path}, and no key of this project is a secret: "
                f"set it in plain text with `pulumi config set {'--path ' if prefix else ''}'{key}' VALUE`"
            )
        if isinstance(value, Mapping):
            _reject_encrypted(path, value, f"{key}.")


def load_stack_file(path_or_stack_name: str | Path) -> StackConfig:
    """Read and validate `Pulumi.<stack>.yaml` (a path, or a stack name looked up next to Pulumi.yaml)."""
    values, stack = read_stack_values(path_or_stack_name)
    return parse_stack_config(values, stack)


def from_pulumi() -> StackConfig:
    """The stack config of the running Pulumi program (or of a mock runtime)."""
    import pulumi
    from pulumi.runtime.config import CONFIG  # every key the engine passed, so unknown ones are caught

    raw = {**pulumi.runtime.get_config_env(), **CONFIG.get()}
    return parse_stack_config({key: _decode(value) for key, value in raw.items()}, pulumi.get_stack())


def _decode(value: Any) -> Any:
    """The engine passes structured config (mappings set with --path) as JSON text."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def offline_values(path_or_stack_name: str | Path, *, doing: str | None = None) -> tuple[dict[str, Any], str]:
    """`read_stack_values`, with PLACEHOLDER_PROJECT where the file sets no gcp:project; with
    `doing` ("previewing", "rendering") a note on stderr says so."""
    values, stack = read_stack_values(path_or_stack_name)
    if "gcp:project" not in values:
        if doing:
            print(f"note: gcp:project is not set for stack {stack}; {doing} with {PLACEHOLDER_PROJECT!r}", file=sys.stderr)
        values["gcp:project"] = PLACEHOLDER_PROJECT
    return values, stack
