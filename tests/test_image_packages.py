"""The trainer image's lean package set (docs/dependencies.md): gemma, kauldron, dialog and TensorFlow are
installed without their declared dependencies, so their locks must hold what they do need, at versions
they accept, and nothing of what was left out; and the tests run on that same set.

`python -m bench.image` installs the set as the Dockerfile does and runs the trainer on it (needs PyPI)."""

from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from bench.image import install_args
from tests.infra.test_locks import direct_pins, locked

NO_DEPS_PINS, NO_DEPS_LOCK = "trainer/requirements-no-deps.txt", "trainer/requirements-no-deps.lock"
IMAGE_LOCK, DEV_LOCK = "trainer/requirements.lock", "requirements-dev.lock"
# What those packages declare and the trainer never imports: with these absent the tiny run, the
# preparation and the export run (python -m bench.image); with their own dependencies, 119 packages and 1.1 GB.
LEFT_OUT = {
    "gemma": {"fastmcp", "mcp"},  # an MCP server for gemma's tools
    "dialog": {"anywidget", "mcp"},  # notebook widgets, MCP
    "kauldron": {"altair", "opencv-python", "scikit-image", "scikit-learn", "xmanager"},  # plots, images, job launcher
    "tensorflow-cpu": {"libclang"},  # TensorFlow's code generators
}


def declared(package: str) -> list[Requirement]:
    """The installed package's requirements, those of the extras it is asked for included."""
    return [Requirement(text) for text in metadata.requires(package) or ()]


def needed(requirement: Requirement, extras: set[str]) -> bool:
    return requirement.marker is None or any(requirement.marker.evaluate({"extra": extra}) for extra in extras | {""})


def test_each_no_deps_package_is_locked_at_its_pin_with_its_wheel_hash():
    entries = locked(NO_DEPS_LOCK)
    assert {name: version for name, (version, _) in entries.items()} == direct_pins(NO_DEPS_PINS)
    assert [name for name, (_, hashes) in entries.items() if hashes == 0] == []


def test_the_image_and_the_tests_install_none_of_what_was_left_out():
    left_out = {canonicalize_name(name) for names in LEFT_OUT.values() for name in names}
    for lock in (IMAGE_LOCK, NO_DEPS_LOCK, DEV_LOCK):
        assert sorted(left_out & set(locked(lock))) == [], lock


@pytest.mark.parametrize("package", sorted(LEFT_OUT))
def test_what_a_no_deps_package_declares_is_locked_at_a_version_it_accepts_or_left_out(package):
    """pip does not check a --no-deps package's dependencies: a lock that lost one, or moved it past the
    package's bounds, fails here rather than at import in the image."""
    pinned = locked(NO_DEPS_LOCK)[package][0]
    try:
        installed = metadata.version(package)
    except metadata.PackageNotFoundError:
        installed = None
    if installed != pinned:
        pytest.skip(f"{package} {pinned} is not installed here ({installed}): `make setup` installs it")
    image = {name: version for name, (version, _) in locked(IMAGE_LOCK).items()} | {
        name: version for name, (version, _) in locked(NO_DEPS_LOCK).items()
    }
    wanted, seen, problems = [(requirement, {""}) for requirement in declared(package)], set(), []
    while wanted:
        requirement, extras = wanted.pop()
        name = canonicalize_name(requirement.name)
        if not needed(requirement, extras) or name in LEFT_OUT[package] or str(requirement) in seen:
            continue
        seen.add(str(requirement))
        if name not in image or not requirement.specifier.contains(image[name], prereleases=True):
            problems.append(f"{requirement} (locked: {image.get(name)})")
        elif requirement.extras:  # e.g. etils[epath]: what the extra adds must be there too
            wanted += [(extra_requirement, set(requirement.extras)) for extra_requirement in declared(name)
                       if extra_requirement.marker is not None and needed(extra_requirement, set(requirement.extras))]
    assert problems == []


def test_the_tests_run_on_the_image_package_set():
    """requirements-dev.lock holds every package of the image at the image's version (plus Pulumi and the
    test tools), and `make setup` adds the same --no-deps lock, so the suite exercises what the image runs."""
    dev = {name: version for name, (version, _) in locked(DEV_LOCK).items()}
    image = {name: version for name, (version, _) in locked(IMAGE_LOCK).items()}
    assert {name: dev.get(name) for name in image} == image


def test_the_dockerfile_installs_both_trainer_locks_hash_checked_without_dependencies():
    args = install_args()
    files = {args[i + 1] for i, arg in enumerate(args) if arg == "-r"}
    assert files == {"requirements.lock", "requirements-no-deps.lock"}
    assert {"--require-hashes", "--no-deps"} <= set(args)
