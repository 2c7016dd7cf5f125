"""Whether the run has been told to stop (SIGTERM: a preempted VM, a deleted pod), agreed by all processes."""

from __future__ import annotations

import signal

from jax.experimental import multihost_utils


class PreemptionNotice:
    """After distributed init, JAX's preemption sync point: it watches for the signal itself and answers
    yes at the same step in every process, so they all checkpoint that step. One process has no sync
    point: a SIGTERM handler sets a flag, and close() puts the previous handler back."""

    def __init__(self, distributed: bool):
        self._distributed = distributed
        self._signalled = False
        self._previous_handler = None if distributed else signal.signal(signal.SIGTERM, self._on_signal)

    def close(self) -> None:
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)

    def _on_signal(self, signum, frame):
        self._signalled = True

    def reached(self, step_number: int) -> bool:
        """Whether to checkpoint `step_number` and stop."""
        if self._distributed:
            return multihost_utils.reached_preemption_sync_point(step_number)
        return self._signalled
