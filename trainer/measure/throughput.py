"""The throughput a run reports: tokens per second, step time and MFU.

`mfu` counts every position of the rows (padding included: the chip computes it) at the FLOPs a token
of a whole row costs, attention over all the row's earlier positions (trainer.measure.flops). Packed
rows hold documents of a few hundred tokens, and attention within a document is all a step computes
usefully, so where the loop hands the meter each step's segment ids and the meter knows the model,
`mfu_documents` counts the same positions' weight FLOPs and the attention within each document
(flops.attention_flops), and a vision-language run's image FLOPs (flops.image_flops_per_token, every image
of the batch, as `mfu` counts them): no more than the step did.
"""

from __future__ import annotations

import time

import jax

from trainer.measure import flops
from trainer.run import hardware


class ThroughputMeter:
    """Measures over the steps since the last restart; `positions_per_step` is batch size x sequence length.
    With `model_config` (and the run's `lora_rank` and `image_flops_per_token`), steps added with their segment ids also give
    `mfu_documents`.

    The first step of a run compiles, so timing starts when it has finished.
    """

    def __init__(self, *, positions_per_step: int, flops_per_token: float, model_config=None, lora_rank: int = 0,
                 image_flops_per_token: float = 0.0):
        self._positions_per_step = positions_per_step
        self._flops_per_token, self._image_flops_per_token = flops_per_token, image_flops_per_token
        self._model_config, self._lora_rank = model_config, lora_rank
        self._peak = hardware.peak_bf16_flops(jax.devices()[0].device_kind)
        self._start = None
        self._token_counts = []
        self._document_attention = []  # per step: this process's rows' attention FLOPs within documents

    def add(self, metrics, segment_ids=None) -> None:
        """Counts a step by its metrics' `tokens` (non-padding) and, where given, the segment ids [B, L] of
        the rows this process fed it."""
        if self._start is None:
            jax.block_until_ready(metrics)
            self.restart()
            return
        self._token_counts.append(metrics["tokens"])
        if segment_ids is not None and self._model_config is not None:
            self._document_attention.append(flops.attention_flops(self._model_config, segment_ids).documents)

    def restart(self) -> None:
        self._start, self._token_counts, self._document_attention = time.perf_counter(), [], []

    def measure(self) -> dict:
        steps = len(self._token_counts)
        if not steps:
            return {}
        elapsed = time.perf_counter() - self._start
        devices = jax.device_count()
        tokens_per_sec = sum(float(count) for count in self._token_counts) / elapsed
        # Every position is computed, padding included, so MFU counts them all.
        positions_per_sec_per_device = self._positions_per_step * steps / elapsed / devices
        report = {
            "tokens_per_sec": tokens_per_sec,
            "tokens_per_sec_per_device": tokens_per_sec / devices,
            "step_time_s": elapsed / steps,
            "mfu": flops.model_flops_utilization(positions_per_sec_per_device, self._flops_per_token, self._peak),
        }
        if len(self._document_attention) == steps:  # every step's segment ids were given
            positions_per_device = self._positions_per_step * steps / devices
            weights = (flops.weight_flops_per_token(self._model_config, lora_rank=self._lora_rank)
                       + self._image_flops_per_token) * positions_per_device
            # This process's rows are spread over its own devices, as the global batch over all of them.
            attention = sum(self._document_attention) / jax.local_device_count()
            report["mfu_documents"] = flops.model_flops_utilization(
                positions_per_sec_per_device, (weights + attention) / positions_per_device, self._peak)
        return report
