"""The per-chip table, looked up by the device_kind strings JAX really reports."""

import pytest

from infra.catalog import tpu
from trainer.run import hardware

GIB = 2**30


@pytest.mark.parametrize(
    "device_kind, peak, hbm_gib",
    [
        ("TPU v5 lite", 197e12, 16),  # v5e
        ("TPU v5", 459e12, 95),  # v5p
        ("TPU v6 lite", 918e12, 32),  # v6e
    ],
)
def test_tpu_device_kinds_as_jax_reports_them(device_kind, peak, hbm_gib):
    # Google's per-chip figures: v5e 197 TFLOP/s and 16 GB, v5p 459 and 95 GB, v6e 918 and 32 GB per chip.
    assert hardware.peak_bf16_flops(device_kind) == peak
    assert hardware.hbm_bytes(device_kind) == hbm_gib * GIB


@pytest.mark.parametrize("device_kind", ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200", "NVIDIA H200 NVL"])
def test_nvidia_hopper_parts_have_dense_bf16_peaks(device_kind):
    # Dense figures: half the datasheets' "with sparsity" numbers, all between 0.7 and 1 PFLOP/s.
    assert 700e12 < hardware.peak_bf16_flops(device_kind) < 1000e12
    assert hardware.hbm_bytes(device_kind) >= 80e9


def test_h200_has_more_memory_than_h100_at_the_same_peak():
    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    assert hardware.peak_bf16_flops(h200) == hardware.peak_bf16_flops(h100)
    assert hardware.hbm_bytes(h200) > hardware.hbm_bytes(h100)


@pytest.mark.parametrize("device_kind", ["cpu", "NVIDIA GeForce RTX 4090", ""])
def test_cpu_and_unknown_devices_have_no_peak(device_kind):
    assert hardware.peak_bf16_flops(device_kind) is None
    assert hardware.hbm_bytes(device_kind) is None


def test_every_catalog_accelerator_maps_to_a_known_chip():
    assert set(hardware.DEVICE_KIND_OF_ACCELERATOR) == set(tpu.ACCELERATORS)
    for device_kind in hardware.DEVICE_KIND_OF_ACCELERATOR.values():
        assert hardware.peak_bf16_flops(device_kind) is not None


def test_cpu_device_kind_of_this_machine_gives_no_peak():
    import jax

    assert hardware.peak_bf16_flops(jax.devices("cpu")[0].device_kind) is None
