"""libtpu's XLA flags for the training step, per TPU generation: passed to the TPU pods as
LIBTPU_INIT_ARGS (workloads.spec), and to every compile of the trainer as compile options where that is
unset (trainer.run.compile_answers), so that `fit` compiles the program the pods run.

The flags are those MaxText's published TPU configs use (its benchmarks/xla_flags_library.py and
configs/v5e), kept where the installed libtpu (0.0.50.1, the image's too) accepts them:
- the scoped VMEM limit of dense models (96 MiB of the v6e TensorCore's on-chip memory for a fusion's
  tiles, instead of the default 16 MiB);
- data-parallel all-reduce optimisation and its pipelining over differently sized operands;
- compute/collective overlap and asynchronous all-gather and all-reduce;
- on v5e only, continuation (async collective) fusion of all-gathers: libtpu refuses to compile with it
  on v6e and v5p ("not supported/recommended on platforms other than TPU v5e").
No Python imports: the workload builders read it.
"""

from __future__ import annotations

_DATA_PARALLEL_OVERLAP = (
    "--xla_tpu_enable_data_parallel_all_reduce_opt=true",
    "--xla_tpu_data_parallel_opt_different_sized_ops=true",
)
_ASYNC_COLLECTIVES = (
    "--xla_tpu_overlap_compute_collective_tc=true",
    "--xla_enable_async_all_gather=true",
    "--xla_enable_async_all_reduce=true",
)
_CONTINUATION_FUSION_FOR_ALL_GATHER = (
    "--xla_tpu_enable_async_collective_fusion=true",
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
)

FLAGS: dict[str, tuple[str, ...]] = {
    "v6e": ("--xla_tpu_scoped_vmem_limit_kib=98304", *_DATA_PARALLEL_OVERLAP, *_ASYNC_COLLECTIVES),
    "v5e": (*_DATA_PARALLEL_OVERLAP, *_ASYNC_COLLECTIVES, *_CONTINUATION_FUSION_FOR_ALL_GATHER),
    "v5p": (*_DATA_PARALLEL_OVERLAP, *_ASYNC_COLLECTIVES),
}


def libtpu_init_args(accelerator: str) -> str:
    """LIBTPU_INIT_ARGS for a slice of `accelerator` ("v6e", "v5e", "v5p")."""
    return " ".join(FLAGS[accelerator])


def compile_options(accelerator: str) -> dict[str, str]:
    """The same flags as a compile's options (name: value)."""
    return dict(flag.removeprefix("--").split("=", 1) for flag in FLAGS[accelerator])
