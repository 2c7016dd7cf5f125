"""gemma-tpu:tpu: the slices the stack's TPU pools hold (accelerator, topology, how many) and the
capacity they run on. The slice shapes these keys name are infra.catalog.tpu's catalog."""

import re
from dataclasses import dataclass

from infra.catalog import tpu
from infra.catalog.tpu import SliceSpec
from infra.config.sections import PROJECT, Section
from infra.errors import ConfigError

CAPACITIES = ("on-demand", "spot", "reservation", "flex-start")
# Autopilot picks capacity from each pod's node selectors; this project wires on-demand and Spot
# there. Reservations and flex-start need node pool settings, so they are Standard-only here.
CAPACITIES_BY_MODE = {"standard": CAPACITIES, "autopilot": ("on-demand", "spot")}
# A reservation in this project, or a shared one of another: projects/OWNER/reservations/NAME.
_RESERVATION = re.compile(r"^(projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/reservations/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# Node labels GKE sets on nodes of each capacity type (and that Autopilot provisions from). A
# reservation has none on a node pool bound to it: `cloud.google.com/reservation-name` is set on
# auto-provisioned and Autopilot nodes only, so reserved pods select their node pools instead.
CAPACITY_SELECTORS = {
    "on-demand": {},
    "spot": {"cloud.google.com/gke-spot": "true"},
    "flex-start": {"cloud.google.com/gke-flex-start": "true"},
    "reservation": {},
}


@dataclass(frozen=True, kw_only=True)
class TpuConfig:
    accelerator: str
    topology: str
    slices: int
    capacity: str
    reservation: str | None


def parse_tpu(section: Section) -> TpuConfig:
    return TpuConfig(
        accelerator=section.text("accelerator", "v6e", tpu.ACCELERATORS),
        topology=section.text("topology", "1x1"),
        slices=section.integer("slices", 1, minimum=1),
        capacity=section.text("capacity", "on-demand", CAPACITIES),
        reservation=section.text("reservation", "") or None,
    )


def check_tpu(section: Section, config: TpuConfig, cluster_mode: str) -> SliceSpec:
    """The slice shape of the stack's pools, once the catalog has it and the keys fit together."""
    try:
        slice_spec = tpu.slice_spec(config.accelerator, config.topology)
    except ConfigError as error:
        raise ConfigError(f"{section.key('topology')}: {error}") from None
    if config.slices > 1 and not slice_spec.multi_host:
        multi_host = [s.topology for s in tpu.catalog() if s.accelerator == config.accelerator and s.multi_host]
        raise ConfigError(
            f"{section.key('slices')} is {config.slices} but {config.accelerator} {config.topology} is a single-host "
            f"slice; multislice needs a multi-host topology ({', '.join(multi_host)}) or slices: 1"
        )
    allowed = CAPACITIES_BY_MODE[cluster_mode]
    if config.capacity not in allowed:
        raise ConfigError(
            f"{section.key('capacity')} {config.capacity!r} is not supported with {PROJECT}:cluster.mode "
            f"{cluster_mode}; choose one of {', '.join(allowed)}"
        )
    if config.capacity == "reservation" and not config.reservation:
        raise ConfigError(f"{section.key('reservation')} is required with capacity: reservation; give the reservation's name")
    if config.reservation and not _RESERVATION.match(config.reservation):
        raise ConfigError(
            f"{section.key('reservation')} {config.reservation!r} is not a reservation; give its name (such as "
            "my-tpus) or, for a reservation shared from another project, projects/OWNER_PROJECT/reservations/NAME"
        )
    if config.reservation and config.capacity != "reservation":
        raise ConfigError(
            f"{section.key('reservation')} is set but {section.key('capacity')} is {config.capacity!r}; "
            "set capacity: reservation or remove the reservation"
        )
    return slice_spec


def trainer_memory_gib(slice_spec: SliceSpec, cluster_mode: str) -> int | None:
    """Each training container's memory request and limit: the host's bound (SliceSpec) on
    Standard; None on Autopilot, which sizes the node to the pod and sets every container's limit
    to its request itself."""
    return slice_spec.trainer_memory_gib if cluster_mode == "standard" else None


def capacity_chips(slice_spec: SliceSpec, slices: int) -> int:
    """TPU chips `slices` slices of the shape hold: what a run of them requests, and a pool set's capacity."""
    return slice_spec.chips * slices
