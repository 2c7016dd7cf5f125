"""The trainer image's package set (docs/dependencies.md): only what the trainer imports, jax[tpu]'s libtpu
and their dependencies, with none of gemma, kauldron, dialog or TensorFlow. The dev venv adds the gemma stack
(requirements-gemma.lock, installed without its declared dependencies) for the comparison tests, so the
dev lock must hold what that stack does need, at versions it accepts, and nothing of what was left out;
and the tests run on the image's set.

`python -m bench.image` installs the set as the Dockerfile does and runs the trainer on it (needs PyPI)."""

from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from bench.image import install_args
from tests.infra.test_locks import direct_pins, locked

GEMMA_PINS, GEMMA_LOCK = "requirements-gemma.txt", "requirements-gemma.lock"
IMAGE_LOCK, DEV_LOCK = "trainer/requirements.lock", "requirements-dev.lock"
# The trainer imports none of these: their return to the image's lock (through a new pin or a dependency)
# brings back the 1.3 GB that leaving them out saved.
NOT_IN_THE_IMAGE = {"gemma", "kauldron", "dialog", "tensorflow", "tensorflow-cpu", "tensorflow-datasets"}
# What the gemma stack declares and never imports: with these absent its comparison tests run; with their
# own dependencies, 119 packages and 1.1 GB.
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


def versions(lock: str) -> dict[str, str]:
    return {name: version for name, (version, _) in locked(lock).items()}


def test_the_image_lock_holds_no_gemma_kauldron_dialog_or_tensorflow():
    assert sorted(NOT_IN_THE_IMAGE & set(locked(IMAGE_LOCK))) == []


def test_each_gemma_stack_package_is_locked_at_its_pin_with_its_wheel_hash():
    entries = locked(GEMMA_LOCK)
    assert {name: version for name, (version, _) in entries.items()} == direct_pins(GEMMA_PINS)
    assert [name for name, (_, hashes) in entries.items() if hashes == 0] == []


def test_the_image_and_the_tests_install_none_of_what_was_left_out():
    left_out = {canonicalize_name(name) for names in LEFT_OUT.values() for name in names}
    for lock in (IMAGE_LOCK, GEMMA_LOCK, DEV_LOCK):
        assert sorted(left_out & set(locked(lock))) == [], lock


@pytest.mark.parametrize("package", sorted(LEFT_OUT))
def test_what_a_gemma_stack_package_declares_is_in_the_dev_lock_at_a_version_it_accepts_or_left_out(package):
    """pip does not check a --no-deps package's dependencies: a dev lock that lost one, or moved it past the
    package's bounds, fails here rather than at import in the comparison tests."""
    pinned = locked(GEMMA_LOCK)[package][0]
    try:
        installed = metadata.version(package)
    except metadata.PackageNotFoundError:
        installed = None
    if installed != pinned:
        pytest.skip(f"{package} {pinned} is not installed here ({installed}): `make setup` installs it")
    dev = versions(DEV_LOCK) | versions(GEMMA_LOCK)
    wanted, seen, problems = [(requirement, {""}) for requirement in declared(package)], set(), []
    while wanted:
        requirement, extras = wanted.pop()
        name = canonicalize_name(requirement.name)
        if not needed(requirement, extras) or name in LEFT_OUT[package] or str(requirement) in seen:
            continue
        seen.add(str(requirement))
        if name not in dev or not requirement.specifier.contains(dev[name], prereleases=True):
            problems.append(f"{requirement} (locked: {dev.get(name)})")
        elif requirement.extras:  # e.g. etils[epath]: what the extra adds must be there too
            wanted += [(extra_requirement, set(requirement.extras)) for extra_requirement in declared(name)
                       if extra_requirement.marker is not None and needed(extra_requirement, set(requirement.extras))]
    assert problems == []


def test_the_tests_run_on_the_image_package_set():
    """requirements-dev.lock holds every package of the image at the image's version (plus Pulumi, the gemma
    stack's dependencies and the test tools), so the suite exercises what the image runs."""
    dev, image = versions(DEV_LOCK), versions(IMAGE_LOCK)
    assert {name: dev.get(name) for name in image} == image


def test_the_dockerfile_installs_only_the_trainer_lock_hash_checked_without_dependencies():
    args = install_args()
    files = [args[i + 1] for i, arg in enumerate(args) if arg in ("-r", "-c")]
    assert files == ["requirements.lock"]
    assert {"--require-hashes", "--no-deps"} <= set(args)
    assert [arg for arg in args if not arg.startswith("-") and arg not in files] == []  # no package named


def test_gs_paths_resolve_to_gcsfs():
    """etils.epath (Orbax, trainer.run.checkpoint, the tokenizer) reads gs:// through fsspec when TensorFlow is
    absent, as in the image: fsspec must find gcsfs's filesystem class (not constructed here: no network)."""
    import fsspec

    assert "gcsfs" in versions(IMAGE_LOCK)
    assert fsspec.get_filesystem_class("gs").__module__.startswith("gcsfs")
