"""Per-chip accelerator facts for MFU and memory estimates, keyed by the `device_kind` JAX reports.

The keys are the exact `jax.Device.device_kind` strings: JAX names TPU v5e "TPU v5 lite", v5p
"TPU v5" and v6e "TPU v6 lite" (jax/_src/tpu_info.py `chip_version_from_device_kind`, which also
accepts the marketing spellings listed here), and an NVIDIA GPU by its CUDA device name
("NVIDIA H100 80GB HBM3" is the SXM part; jax/_src/pallas/triton/gpu_info.py). One JAX device is
one chip on every kind listed (v4 and v5p run their two TensorCores as one megacore device).

Sources for the figures (dense bf16, no sparsity):
- TPU: cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e (peak TFLOP/s, HBM capacity and bandwidth per
  chip: v4 275, 32 GiB, 1,200 GB/s; v5e 197, 16 GB, 819 GB/s; v5p 459, 95 GB, 2,765 GB/s; v6e 918,
  32 GB, 1,638 GB/s), and the bidirectional inter-chip interconnect (ICI) bandwidth per chip: v5e 400
  GB/s, v5p 1,200 GB/s, v6e 800 GB/s (v4's is not given in the same terms: left out).
- NVIDIA: the H100 datasheet (SXM 989 TFLOP/s, PCIe 756, NVL 835; HBM 80/80/94 GB at 3.35/2.0/3.9
  TB/s) and the H200 datasheet (SXM 989 TFLOP/s, NVL 835; 141 GB at 4.8 TB/s). The datasheets print
  twice these FLOP/s "with sparsity".
"""

import dataclasses

_GIB = 2**30
_GB = 10**9


@dataclasses.dataclass(frozen=True)
class Chip:
    peak_bf16_flops: float  # FLOP/s per chip, dense bf16
    hbm_bytes: int
    hbm_bytes_per_s: float  # HBM bandwidth per chip
    ici_bytes_per_s: float | None = None  # TPU: bidirectional inter-chip interconnect bandwidth per chip


_TPU_V4 = Chip(peak_bf16_flops=275e12, hbm_bytes=32 * _GIB, hbm_bytes_per_s=1200e9)
_TPU_V5E = Chip(peak_bf16_flops=197e12, hbm_bytes=16 * _GIB, hbm_bytes_per_s=819e9, ici_bytes_per_s=400e9)
_TPU_V5P = Chip(peak_bf16_flops=459e12, hbm_bytes=95 * _GIB, hbm_bytes_per_s=2765e9, ici_bytes_per_s=1200e9)
_TPU_V6E = Chip(peak_bf16_flops=918e12, hbm_bytes=32 * _GIB, hbm_bytes_per_s=1638e9, ici_bytes_per_s=800e9)
_H100_SXM = Chip(peak_bf16_flops=989e12, hbm_bytes=80 * _GB, hbm_bytes_per_s=3.35e12)
_H100_PCIE = Chip(peak_bf16_flops=756e12, hbm_bytes=80 * _GB, hbm_bytes_per_s=2.0e12)
_H100_NVL = Chip(peak_bf16_flops=835e12, hbm_bytes=94 * _GB, hbm_bytes_per_s=3.9e12)
_H200_SXM = Chip(peak_bf16_flops=989e12, hbm_bytes=141 * _GB, hbm_bytes_per_s=4.8e12)
_H200_NVL = Chip(peak_bf16_flops=835e12, hbm_bytes=141 * _GB, hbm_bytes_per_s=4.8e12)

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
