"""The dtype the forward and backward passes compute in, chosen per platform; the masters stay float32.

bfloat16 wherever the hardware multiplies it natively: TPU, GPU, and CPUs with bfloat16
dot-product instructions (x86 AVX512_BF16 or AMX-BF16, Arm BF16), where XLA's CPU matmuls in
bfloat16 take about half the time of float32 ones (BENCHMARKS.md, the what-if run).
Other CPUs have no fast bfloat16 path, so they compute in float32 and skip the conversions.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp

CPUINFO = pathlib.Path("/proc/cpuinfo")
# /proc/cpuinfo feature names: x86 "flags", Arm "Features".
NATIVE_BF16_CPU_FEATURES = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_features(cpuinfo: str) -> set[str]:
    """The feature names a /proc/cpuinfo text lists (its `flags` or `Features` lines)."""
    features: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            features.update(value.split())
    return features


def cpu_has_native_bf16(cpuinfo: str) -> bool:
    return bool(cpu_features(cpuinfo) & NATIVE_BF16_CPU_FEATURES)


def compute_dtype(requested: str = "auto", *, backend: str | None = None, cpuinfo: str | None = None):
    """The dtype `--compute-dtype` asks for; for "auto", bfloat16 or float32 as suits `backend`
    (default: JAX's), with `cpuinfo` defaulting to this machine's /proc/cpuinfo."""
    if requested != "auto":
        return jnp.dtype(requested).type
    backend = backend or jax.default_backend()
    if backend != "cpu":
        return jnp.bfloat16
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text()
        except OSError:  # not Linux: no feature list to go by
            cpuinfo = ""
    return jnp.bfloat16 if cpu_has_native_bf16(cpuinfo) else jnp.float32
