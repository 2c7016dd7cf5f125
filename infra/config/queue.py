"""gemma-tpu:queue: Kueue in front of the TPUs, and the quota every run must fit in."""

from dataclasses import dataclass

from infra.catalog.tpu import SliceSpec
from infra.config.runs import RunConfig
from infra.config.sections import PROJECT, Section
from infra.config.slices import capacity_chips
from infra.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class QueueConfig:
    """Kueue in front of the TPUs: runs wait in a queue whose TPU quota is the pools' capacity."""

    enabled: bool
    tpu_quota: int  # google.com/tpu chips the queue admits at once; the pools' capacity by default


def read_queue(section: Section) -> tuple[bool, int | None]:
    """enabled and tpuQuota (None: unset). The quota's default, the pools' capacity, is known only
    once the TPU keys are checked, after every key is read."""
    return section.flag("enabled", False), section.integer("tpuQuota", None, minimum=1)


def check_queue(section: Section, queue: QueueConfig, runs: tuple[RunConfig, ...], slice_spec: SliceSpec, capacity: int,
                *, queued_provisioning: bool, run_list: bool) -> None:
    if len(runs) > 1 and not queue.enabled:
        raise ConfigError(
            f"{PROJECT}:runs holds {len(runs)} runs on one set of TPU pools; set {section.key('enabled')} true so that "
            "Kueue admits them in turn (each whole or not at all)"
        )
    if queue.tpu_quota > capacity:
        raise ConfigError(
            f"{section.key('tpuQuota')} is {queue.tpu_quota} chips, over the {capacity} chips the stack's TPU pools hold; "
            f"set at most {capacity} (or leave it unset: the pools' capacity)"
        )
    for index, run in enumerate(runs):
        if queued_provisioning and run.slices > 1:
            # Google documents queued provisioning of a multi-host slice (one node pool, COMPACT
            # placement with the topology, the request's tpu-topology parameter: its TPU v6e
            # example), not of several slices for one run.
            key = f"{PROJECT}:runs[{index}].slices" if run_list else f"{PROJECT}:tpu.slices"
            raise ConfigError(
                f"{key} is {run.slices}, but queued provisioning (flex-start capacity behind the queue) brings "
                "the nodes of one slice a run; set it to 1, or choose another capacity"
            )
        needs = capacity_chips(slice_spec, run.slices)
        if needs > queue.tpu_quota:
            raise ConfigError(
                f"{section.key('tpuQuota')} is {queue.tpu_quota} chips, but run {run.name!r} needs {needs} "
                f"({run.slices} x {slice_spec.topology}) and would never be admitted; raise the quota or give the run fewer slices"
            )
