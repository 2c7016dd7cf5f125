"""`python -m tests.trainer.run.grad_accum_mesh_run` (with 4 host devices, XLA_FLAGS): the train step on a
data=2, fsdp=2 mesh with --grad-accum-steps 1 and 2, as one JSON line: each program's collectives by kind
and the largest difference of the gradients from the one pass's, relative to each leaf's norm."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np

from trainer.model import models
from trainer.nn import layers as layers_lib
from trainer.run import mesh, step
from trainer.run import optimizer as optimizer_lib

COLLECTIVES = ("all-to-all", "collective-permute", "all-gather", "all-reduce", "reduce-scatter")


def main() -> None:
    device_mesh = mesh.build_mesh({"data": 2, "fsdp": 2})
    config = models.model_config("tiny", vocab_size=64)
    model, params = models.build_model(config, dtype=jnp.float32), models.init_params(config, seed=0)
    # Its new weights are the step's gradients.
    recorder = optimizer_lib.Optimizer(init=lambda p: (), update=lambda grads, state, p: (grads, state),
                                       apply_updates=lambda p, grads: grads, param_dtype=jnp.float32)
    rows, length = 16, 16
    tokens = (np.arange(rows * length, dtype=np.int32).reshape(rows, length) * 7) % 60 + 4
    mask = np.ones((rows, length), np.float32)
    mask[3::4, 4:] = 0
    batch = mesh.global_batch({"input_tokens": tokens, "target_tokens": np.roll(tokens, -1, axis=1),
                               "segment_ids": np.ones_like(tokens), "positions": np.tile(np.arange(length, dtype=np.int32), (rows, 1)),
                               "loss_mask": mask}, device_mesh)
    layers = layers_lib.LayerOptions(mesh=device_mesh, batch_axes=mesh.BATCH_AXES)
    collectives, gradients = {}, {}
    for steps in (1, 2):
        state = step.fresh_state(jax.tree.map(jnp.copy, params), recorder)
        shardings = mesh.state_shardings(device_mesh, state)
        functions = step.make_step_functions(model, recorder, compute_dtype=jnp.float32, softcap=None, vocab_chunk=None,
                                             state_shardings=shardings, layers=layers, grad_accum_steps=steps)
        state = jax.device_put(state, shardings)
        hlo = functions.train.lower(state, None, batch).compile().as_text()
        collectives[steps] = {kind: len(re.findall(rf"= \S+ {kind}(?:-start)?\(", hlo)) for kind in COLLECTIVES}
        gradients[steps] = functions.train(state, None, batch)[0]["params"]
    error = max(float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))
                for got, want in zip(jax.tree.leaves(gradients[2]), jax.tree.leaves(gradients[1])))
    print(json.dumps({"collectives": collectives, "gradient_error": error}))


if __name__ == "__main__":
    main()
