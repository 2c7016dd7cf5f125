"""The dependency locks (docs/dependencies.md) agree with the pins they were made from: a pin
changed without `make lock` fails here, before an image or a `pulumi up` installs something else."""

import re
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from infra.config.stack_files import PROJECT_ROOT

# (the pins a user edits, the lock pip-compile made from them)
LOCKS = {
    "the Pulumi program": ("requirements.txt", "requirements.lock"),
    "the trainer image": ("trainer/requirements-image.in", "trainer/requirements.lock"),
    "the tests": ("requirements-dev.txt", "requirements-dev.lock"),
}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(\S+)")


def direct_pins(relative: str) -> dict[str, str]:
    """name -> version of every `name==version` in a requirements file and the files it `-r`s."""
    path = PROJECT_ROOT / relative
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            pins.update(direct_pins(str((path.parent / line[3:].strip()).relative_to(PROJECT_ROOT))))
        elif match := _PIN.match(line):
            pins[canonicalize_name(match[1])] = match[3]
    return pins


def locked(relative: str) -> dict[str, tuple[str, int]]:
    """name -> (version, number of sha256 hashes) of every package in a pip-compile lock."""
    entries: dict[str, tuple[str, int]] = {}
    name = None
    for line in Path(PROJECT_ROOT / relative).read_text().splitlines():
        if match := _PIN.match(line):
            name = canonicalize_name(match[1])
            entries[name] = (match[3], 0)
        elif name and line.strip().startswith("--hash=sha256:"):
            version, hashes = entries[name]
            entries[name] = (version, hashes + 1)
    return entries


@pytest.mark.parametrize("pins,lock", LOCKS.values(), ids=LOCKS)
def test_every_pin_is_locked_at_its_version(pins, lock):
    versions = {name: version for name, (version, _) in locked(lock).items()}
    assert {name: versions.get(name) for name in direct_pins(pins)} == direct_pins(pins)


@pytest.mark.parametrize("lock", [lock for _, lock in LOCKS.values()])
def test_every_locked_package_has_its_file_hashes(lock):
    """With a hash on every line pip installs in hash-checking mode: a changed file is refused."""
    entries = locked(lock)
    assert entries and [name for name, (_, hashes) in entries.items() if hashes == 0] == []


def test_a_package_has_one_version_in_all_locks():
    """The tests run the versions that the image and the Pulumi program run."""
    versions: dict[str, set[str]] = {}
    for _, lock in LOCKS.values():
        for name, (version, _) in locked(lock).items():
            versions.setdefault(name, set()).add(version)
    assert {name: found for name, found in versions.items() if len(found) > 1} == {}


def test_the_image_lock_has_the_tpu_runtime():
    image = locked("trainer/requirements.lock")
    assert "libtpu" in image and image["jax"][0] == image["jaxlib"][0]
