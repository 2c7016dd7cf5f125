"""requirements-hf.lock, which .venv-hf is installed from (`make lock-hf`, docs/dependencies.md), agrees
with the pins of requirements-hf.txt and holds every file's hash, as the other locks do (tests/infra/test_locks.py)."""

from tests.infra.test_locks import PROJECT_ROOT, direct_pins, locked

PINS, LOCK = "requirements-hf.txt", "requirements-hf.lock"


def test_every_hf_pin_is_locked_at_its_version_and_every_package_has_its_hashes():
    entries = locked(LOCK)
    assert {name: entries.get(name, (None, 0))[0] for name in direct_pins(PINS)} == direct_pins(PINS)
    assert [name for name, (_, hashes) in entries.items() if hashes == 0] == []


def test_torch_is_the_cpu_wheel_of_the_local_folder_alone():
    """PyPI's Linux torch is the CUDA build (GBs of nvidia wheels): the lock holds the one CPU wheel's hash."""
    version, hashes = locked(LOCK)["torch"]
    assert version.endswith("+cpu") and hashes == 1
    assert "--find-links /opt/wheels" in (PROJECT_ROOT / LOCK).read_text().splitlines()
