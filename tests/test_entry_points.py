"""Every `python -m` entry point of bench/ and trainer/measure that starts JAX goes through the platform
guard first (trainer.run.mesh.require_requested_platform, via trainer.run.mesh.jax_entry_point), so that none
prints libtpu's start-up errors on a host without a TPU, and a requested backend that does not start is
one line and exit 2; the others do not import JAX at all."""

import importlib
import pathlib
import subprocess
import sys

import pytest

from trainer.run import mesh
from trainer.errors import UserError

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Entry points that start no JAX: a virtualenv check, a wheel download, a plot of a metrics file.
WITHOUT_JAX = {"bench.image", "bench.device_wheels", "trainer.measure.plot"}


def entry_points() -> list[str]:
    modules = []
    for folder in ("bench", "trainer/measure"):
        for path in sorted((ROOT / folder).glob("*.py")):
            if 'if __name__ == "__main__":' in path.read_text():
                name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                modules.append(name.removesuffix(".__main__"))
    return modules


def test_the_entry_points_are_found():
    assert {"bench", "bench.device", "bench.device_side", "trainer.measure.memory_table"} <= set(entry_points())


@pytest.mark.parametrize("name", sorted(set(entry_points()) - WITHOUT_JAX))
def test_each_entry_point_starts_jax_through_the_guard(name, monkeypatch, capsys):
    def refuse():
        raise UserError("the platform guard ran first")

    monkeypatch.setattr(mesh, "require_requested_platform", refuse)
    module = importlib.import_module(name if name != "bench" else "bench.__main__")
    assert module.main([]) == 2
    assert "error: the platform guard ran first" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(WITHOUT_JAX))
def test_the_others_do_not_import_jax(name):
    code = f"import sys, {name}; sys.exit('jax' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
