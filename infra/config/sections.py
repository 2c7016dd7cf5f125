"""What every section's parser shares: typed reads of one mapping of the stack file, and the check
of a Kubernetes name."""

import difflib
import re
from collections.abc import Mapping
from typing import Any

from infra.errors import ConfigError

PROJECT = "gemma-tpu"  # the Pulumi project name, the namespace of this program's keys
# Keys an earlier version of this schema had, and where their setting lives now.
MOVED_KEYS = {f"{PROJECT}:cluster.deletionProtection": f"{PROJECT}:protect"}
# Kubernetes names (DNS-1123 labels); a run name's limit depends on the names derived from it (infra.catalog.names).
DNS_LABEL = re.compile(r"^[a-z]([a-z0-9-]*[a-z0-9])?$")


class Section:
    """Typed reads from one mapping of the stack file, remembering which keys were read so that
    the rest can be reported as unknown."""

    def __init__(self, key: str, values: Any):
        if values is None:
            values = {}
        if not isinstance(values, Mapping):
            raise ConfigError(f"{key} must be a mapping of keys to values, got {values!r}")
        self._prefix = f"{key}." if key else ""
        self._values = values
        self._known: list[str] = []

    def key(self, name: str) -> str:
        return f"{self._prefix}{name}"

    def _get(self, name: str, default: Any) -> Any:
        self._known.append(name)
        value = self._values.get(name)
        return default if value is None else value

    def text(self, name: str, default: str, choices: tuple[str, ...] = ()) -> str:
        value = self._get(name, default)
        if not isinstance(value, str):
            raise ConfigError(f"{self.key(name)} must be a string, got {value!r}")
        if choices and value not in choices:
            raise ConfigError(f"{self.key(name)} is {value!r}; choose one of {', '.join(choices)}")
        return value

    def integer(self, name: str, default: int | None, minimum: int, maximum: int | None = None) -> int | None:
        value = self._get(name, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{self.key(name)} must be an integer, got {value!r}")
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
            raise ConfigError(f"{self.key(name)} is {value}; it must be {bound}")
        return value

    def number(self, name: str, default: float, above: float, maximum: float) -> float:
        value = self._get(name, default)
        # `pulumi config set --path` stores 2e-5 as the string "2e-5" (it converts only ints and bools).
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{self.key(name)} must be a number, got {value!r}")
        if not above < value <= maximum:
            raise ConfigError(f"{self.key(name)} is {value}; it must be above {above} and at most {maximum}")
        return float(value)

    def text_list(self, name: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self._get(name, default)
        if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
            raise ConfigError(f"{self.key(name)} must be a list of strings, got {value!r}")
        return tuple(value)

    def flag(self, name: str, default: bool) -> bool:
        value = self._get(name, default)
        # The engine passes top-level values as text, and `pulumi config set KEY true` stores "true".
        value = {"true": True, "false": False}.get(value, value) if isinstance(value, str) else value
        if not isinstance(value, bool):
            raise ConfigError(f"{self.key(name)} must be true or false, got {value!r}")
        return value

    def written(self) -> dict[str, Any]:
        """The section's keys and values as written in the stack file."""
        return dict(self._values)

    def raw(self, name: str) -> Any:
        """The value as written (None when unset), for values that are neither scalars nor mappings."""
        return self._get(name, None)

    def section(self, name: str) -> "Section":
        return Section(self.key(name), self._get(name, None))

    def reject_unknown(self) -> None:
        for name in map(str, self._values):  # YAML may give a key such as `1:` as a number
            if name in self._known:
                continue
            key = self.key(name)
            if key in MOVED_KEYS:
                raise ConfigError(f"{key} is now {MOVED_KEYS[key]}; set that key instead and remove this one")
            section = name.split(".")[0]
            if section in self._known:
                raise ConfigError(
                    f"{key} is not a known key; to set a key inside {section}, run "
                    f"`pulumi config set --path '{name}' VALUE`"
                )
            raise ConfigError(f"{key} is not a known key{self._suggestion(name)}; the keys here are {', '.join(self._known)}")

    def _suggestion(self, name: str) -> str:
        """` (did you mean X?)` for a misspelt key or one written without its `gemma-tpu:` namespace."""
        namespaced = [known for known in self._known if known.split(":")[-1] == name]
        close = namespaced or difflib.get_close_matches(name, self._known, n=1)
        return f" (did you mean {close[0]}?)" if close else ""


def check_dns_label(key: str, value: str, max_length: int) -> None:
    if len(value) > max_length or not DNS_LABEL.match(value):
        raise ConfigError(
            f"{key} {value!r} must be at most {max_length} characters of a-z, 0-9 and '-', starting with a letter"
        )
