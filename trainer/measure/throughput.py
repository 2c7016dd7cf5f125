"""The throughput a run reports: tokens per second, step time and MFU."""

from __future__ import annotations

import time

import jax

from trainer.measure import flops
from trainer.run import hardware


class ThroughputMeter:
    """Measures over the steps since the last restart; `positions_per_step` is batch size x sequence length.

    The first step of a run compiles, so timing starts when it has finished.
    """

    def __init__(self, *, positions_per_step: int, flops_per_token: float):
        self._positions_per_step = positions_per_step
        self._flops_per_token = flops_per_token
        self._peak = hardware.peak_bf16_flops(jax.devices()[0].device_kind)
        self._start = None
        self._token_counts = []

    def add(self, metrics) -> None:
        """Counts a step by its metrics' `tokens` (non-padding)."""
        if self._start is None:
            jax.block_until_ready(metrics)
            self.restart()
        else:
            self._token_counts.append(metrics["tokens"])

    def restart(self) -> None:
        self._start, self._token_counts = time.perf_counter(), []

    def measure(self) -> dict:
        steps = len(self._token_counts)
        if not steps:
            return {}
        elapsed = time.perf_counter() - self._start
        devices = jax.device_count()
        tokens_per_sec = sum(float(count) for count in self._token_counts) / elapsed
        # Every position is computed, padding included, so MFU counts them all.
        positions_per_sec_per_device = self._positions_per_step * steps / elapsed / devices
        return {
            "tokens_per_sec": tokens_per_sec,
            "tokens_per_sec_per_device": tokens_per_sec / devices,
            "step_time_s": elapsed / steps,
            "mfu": flops.model_flops_utilization(positions_per_sec_per_device, self._flops_per_token, self._peak),
        }
