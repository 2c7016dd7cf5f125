"""Per-chip accelerator facts for MFU and memory estimates, keyed by the `device_kind` JAX reports.

The keys are the exact `jax.Device.device_kind` strings: JAX names TPU v5e "TPU v5 lite", v5p
"TPU v5" and v6e "TPU v6 lite" (jax/_src/tpu_info.py `chip_version_from_device_kind`, which also
accepts the marketing spellings listed here), and an NVIDIA GPU by its CUDA device name
("NVIDIA H100 80GB HBM3" is the SXM part; jax/_src/pallas/triton/gpu_info.py). One JAX device is
one chip on every kind listed (v4 and v5p run their two TensorCores as one megacore device).

Sources for the figures (dense bf16, no sparsity):
- TPU: cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e (peak TFLOP/s and HBM per chip).
- NVIDIA: the H100 datasheet (SXM 989 TFLOP/s, PCIe 756, NVL 835; HBM 80/80/94 GB) and the
  H200 datasheet (SXM 989 TFLOP/s, NVL 835; 141 GB). The datasheets print twice these
  figures "with sparsity".
"""

import dataclasses

_GIB = 2**30
_GB = 10**9


@dataclasses.dataclass(frozen=True)
class Chip:
    peak_bf16_flops: float  # FLOP/s per chip, dense bf16
    hbm_bytes: int


_TPU_V4 = Chip(peak_bf16_flops=275e12, hbm_bytes=32 * _GIB)
_TPU_V5E = Chip(peak_bf16_flops=197e12, hbm_bytes=16 * _GIB)
_TPU_V5P = Chip(peak_bf16_flops=459e12, hbm_bytes=95 * _GIB)
_TPU_V6E = Chip(peak_bf16_flops=918e12, hbm_bytes=32 * _GIB)
_H100_SXM = Chip(peak_bf16_flops=989e12, hbm_bytes=80 * _GB)
_H100_PCIE = Chip(peak_bf16_flops=756e12, hbm_bytes=80 * _GB)
_H100_NVL = Chip(peak_bf16_flops=835e12, hbm_bytes=94 * _GB)
_H200_SXM = Chip(peak_bf16_flops=989e12, hbm_bytes=141 * _GB)
_H200_NVL = Chip(peak_bf16_flops=835e12, hbm_bytes=141 * _GB)

CHIPS: dict[str, Chip] = {
    "TPU v4": _TPU_V4,
    "TPU v5 lite": _TPU_V5E,
    "TPU v5e": _TPU_V5E,
    "TPU v5": _TPU_V5P,
    "TPU v5p": _TPU_V5P,
    "TPU v6 lite": _TPU_V6E,
    "TPU v6e": _TPU_V6E,
    "NVIDIA H100 80GB HBM3": _H100_SXM,
    "NVIDIA H100 PCIe": _H100_PCIE,
    "NVIDIA H100 NVL": _H100_NVL,
    "NVIDIA H200": _H200_SXM,
    "NVIDIA H200 NVL": _H200_NVL,
}

# The stack config's accelerator names (infra catalog) as JAX reports the chip.
DEVICE_KIND_OF_ACCELERATOR = {"v5e": "TPU v5 lite", "v5p": "TPU v5", "v6e": "TPU v6 lite"}


def peak_bf16_flops(device_kind: str) -> float | None:
    """Dense bf16 FLOP/s of one chip, or None when unknown (CPU, another GPU): MFU is then "n/a"."""
    chip = CHIPS.get(device_kind)
    return chip.peak_bf16_flops if chip else None


def hbm_bytes(device_kind: str) -> int | None:
    """High-bandwidth memory of one chip in bytes, or None when unknown."""
    chip = CHIPS.get(device_kind)
    return chip.hbm_bytes if chip else None
