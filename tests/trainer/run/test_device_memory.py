"""Before step 1 the run compares what the device holds plus what the step needs with the device's limit,
and stops with one line naming what else is live when they do not fit (trainer.run.hbm)."""

import jax
import jax.numpy as jnp
import pytest

from trainer.config import TrainConfig
from trainer.errors import UserError
from trainer.run import hbm

GIB = 2**30


@pytest.fixture(scope="module")
def step_and_state():
    state = {"w": jnp.ones((256, 256), jnp.float32)}
    compiled = jax.jit(lambda s, x: ({"w": s["w"] + x.sum()}, (s["w"] @ s["w"]).sum()), donate_argnums=0).lower(
        state, jnp.ones((8, 256), jnp.float32)).compile()
    return compiled, state


def stats(in_use, limit):
    return lambda device: {"bytes_in_use": in_use, "bytes_limit": limit, "peak_bytes_in_use": in_use}


def test_the_step_beside_the_state_alone_fits_and_says_its_figures(step_and_state):
    compiled, state = step_and_state
    state_bytes = 256 * 256 * 4
    footprint = hbm.before_first_step(compiled, state, None, memory_stats=stats(state_bytes, GIB))
    assert footprint.arguments == state_bytes
    assert footprint.step_needs == hbm.needed_bytes(compiled) - state_bytes
    hbm.check_before_first_step(footprint, TrainConfig())  # fits: nothing raised
    assert footprint.line().startswith("device memory before step 1: 0.00 GiB in use (state and frozen weights 0.00")


def test_a_leftover_array_the_step_did_not_plan_for_stops_the_run_naming_it(step_and_state):
    compiled, state = step_and_state
    leftover = jnp.zeros((1024, 1024), jnp.float32)  # what the loop once kept: the initial float32 weights
    in_use = 256 * 256 * 4 + leftover.nbytes
    step_needs = hbm.needed_bytes(compiled) - 256 * 256 * 4
    # The device holds less than its limit, but not what the step adds beside it
    footprint = hbm.before_first_step(compiled, state, None, memory_stats=stats(in_use, in_use + step_needs - 1))
    assert ("float32[1024, 1024]", leftover.nbytes) in footprint.others
    with pytest.raises(UserError) as refused:
        hbm.check_before_first_step(footprint, TrainConfig())
    message = str(refused.value)
    assert "GiB over; the largest other arrays: float32[1024, 1024] 0.00 GiB" in message
    assert "--mesh" not in message  # one device: splitting the state is not advice that applies
    del leftover


def test_on_a_device_that_does_not_say_its_memory_nothing_is_checked(step_and_state):
    compiled, state = step_and_state
    assert hbm.before_first_step(compiled, state, None, memory_stats=lambda device: None) is None
    hbm.check_before_first_step(None, TrainConfig())


def test_the_advice_names_only_what_applies():
    one_chip = hbm.advice(TrainConfig(precision="lean-factored", remat="full", lora_rank=8), 1)
    assert one_chip == ("lower --batch-size or --seq-len (python -m workloads fit compiles a setting for a slice and names "
                        "the largest batch that fits)")
    eight = hbm.advice(TrainConfig(), 8)
    assert "--precision lean-factored" in eight and "--lora-rank" in eight and "--mesh fsdp=8" in eight


def test_the_compilers_refusal_leaves_a_with_block_as_itself():
    """On the chip a refused step left the loop's compile span as a FrozenInstanceError traceback (a context
    manager that re-raises sets the exception's __traceback__), not as the refusal's one line."""
    import contextlib

    @contextlib.contextmanager
    def span():
        yield

    with pytest.raises(hbm.MemoryRefusal, match="the train step does not fit"):
        with span():
            raise hbm.MemoryRefusal("arguments, outputs and temporaries", 17 * GIB, 15 * GIB)
