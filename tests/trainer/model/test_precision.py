"""The compute dtype per platform: bfloat16 where the hardware multiplies it natively, float32 on other CPUs."""

import jax.numpy as jnp
import pytest

from trainer.nn import precision

# Trimmed /proc/cpuinfo texts of real machines.
ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni
processor\t: 1
flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni
"""
SAPPHIRE_RAPIDS = "flags\t\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8\n"
SKYLAKE = "flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni\n"
NEOVERSE_V1 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"
NEOVERSE_N1 = "processor\t: 0\nFeatures\t: fp asimd aes crc32 atomics\n"


@pytest.mark.parametrize("cpuinfo", [ZEN4, SAPPHIRE_RAPIDS, NEOVERSE_V1], ids=["avx512_bf16", "amx_bf16", "arm_bf16"])
def test_cpus_with_native_bfloat16_compute_in_bfloat16(cpuinfo):
    assert precision.compute_dtype(backend="cpu", cpuinfo=cpuinfo) == jnp.bfloat16


@pytest.mark.parametrize("cpuinfo", [SKYLAKE, NEOVERSE_N1, ""], ids=["x86_without", "arm_without", "no_feature_list"])
def test_other_cpus_compute_in_float32(cpuinfo):
    assert precision.compute_dtype(backend="cpu", cpuinfo=cpuinfo) == jnp.float32


def test_a_feature_name_must_match_whole_not_as_part_of_another():
    assert precision.compute_dtype(backend="cpu", cpuinfo="flags\t: avx512_bf16x notbf16\n") == jnp.float32


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_accelerators_compute_in_bfloat16_whatever_the_host_cpu(backend):
    assert precision.compute_dtype(backend=backend, cpuinfo=SKYLAKE) == jnp.bfloat16


def test_this_machine_reads_its_own_cpu_features():
    expected = jnp.bfloat16 if precision.cpu_has_native_bf16(precision.CPUINFO.read_text()) else jnp.float32
    assert precision.compute_dtype(backend="cpu") == expected


@pytest.mark.parametrize("requested, dtype", [("float32", jnp.float32), ("bfloat16", jnp.bfloat16)])
def test_an_explicit_compute_dtype_overrides_the_platform_choice(requested, dtype):
    assert precision.compute_dtype(requested, backend="tpu") == dtype
    assert precision.compute_dtype(requested, backend="cpu", cpuinfo=ZEN4) == dtype
