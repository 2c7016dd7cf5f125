"""Each TPU generation's XLA flags (trainer.run.tpu_flags) are ones the installed libtpu compiles a sharded
training step with, and every compile takes its own generation's, whatever the process compiled before:
libtpu refuses an unknown flag, and refuses v5e's continuation fusion on v6e."""

import os
import subprocess
import sys

import pytest

from trainer.run import tpu_flags

pytest.importorskip("libtpu", reason="libtpu is in requirements-dev.lock: run `make setup`")

# The gradient of a matmul whose weight is split over 8 chips (all-gathers and a reduce-scatter), compiled
# through the trainer's compile for each generation named, in that order, in one process; then for the last
# one with the first one's flags.
_COMPILE = """
import sys
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec
from trainer.errors import first_line
from trainer.run import compile_answers, mesh, tpu_flags
from trainer.measure import compiled

def lowered(accelerator):
    device_mesh = mesh.build_mesh({"data": 1, "fsdp": 8}, devices=compiled.tpu_devices(accelerator, "2x4"))
    weight = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16, sharding=NamedSharding(device_mesh, PartitionSpec("fsdp")))
    x = jax.ShapeDtypeStruct((64, 1024), jnp.bfloat16, sharding=NamedSharding(device_mesh, PartitionSpec(("data", "fsdp"))))
    step = jax.jit(jax.grad(lambda w, x: jnp.sum(jnp.tanh(x @ w @ w).astype(jnp.float32))))
    return step.lower(weight, x), list(device_mesh.devices.flat)

for accelerator in sys.argv[1:]:
    program, devices = lowered(accelerator)
    compile_answers.compile(program, what=accelerator, devices=devices)
    print("compiled", accelerator)
program, _ = lowered(sys.argv[-1])
try:
    program.compile(tpu_flags.compile_options(sys.argv[1]))
except jax.errors.JaxRuntimeError as error:
    print("refused", first_line(error))
"""


def _compile(*accelerators: str) -> str:
    env = {key: value for key, value in os.environ.items() if key != "LIBTPU_INIT_ARGS"} | {"JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", _COMPILE, *accelerators], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_libtpu_compiles_a_sharded_step_with_each_generations_flags_in_one_process_in_either_order():
    out = _compile("v5e", "v6e", "v5p")
    assert [line for line in out.splitlines() if line.startswith("compiled")] == ["compiled v5e", "compiled v6e", "compiled v5p"]
    assert "refused" in out and "Continuation fusion" in out  # v5p with v5e's flags: the options do reach libtpu
    out = _compile("v6e", "v5e")
    assert "compiled v6e" in out and "compiled v5e" in out


def test_the_flags_as_compile_options_are_the_libtpu_init_args_of_the_pods():
    for accelerator in tpu_flags.FLAGS:
        options = tpu_flags.compile_options(accelerator)
        assert " ".join(f"--{name}={value}" for name, value in options.items()) == tpu_flags.libtpu_init_args(accelerator)
