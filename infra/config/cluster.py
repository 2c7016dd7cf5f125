"""gemma-tpu:cluster: Standard or Autopilot, who reaches the control plane, when GKE may upgrade
the cluster, to which version at least, and GKE's multi-tier checkpointing."""

import ipaddress
import re
from dataclasses import dataclass

from infra.config.sections import Section
from infra.errors import ConfigError

CLUSTER_MODES = ("standard", "autopilot")
# The Standard cluster's CPU pool (infra.cloud.cluster): controllers and data preparation.
CPU_POOL_NODES = (1, 3)  # autoscaling min, max
_DAYS = ("MO", "TU", "WE", "TH", "FR", "SA", "SU")
# GKE needs a maintenance window with at least 48 hours of availability in any 32 days (every
# weekday occurs at least 4 times in 32 days) and each occurrence at least 4 hours long.
_MAINTENANCE_HOURS_IN_32_DAYS = 48
_MAINTENANCE_HOURS_MIN = 4
# Flex-start TPU nodes through queued provisioning (Kueue's ProvisioningRequest admission check)
# need this GKE version (cloud.google.com/kubernetes-engine/docs/how-to/tpu-flex-start ...).
FLEX_START_QUEUED_MIN_GKE = "1.33.0-gke.1712000"
# GKE's multi-tier checkpointing (the HighScaleCheckpointing addon) needs this version, on Standard
# clusters only (cloud.google.com/kubernetes-engine/docs/how-to/machine-learning/training/multi-tier-checkpointing,
# as collected in ../shared/mtc/cluster.md).
MULTI_TIER_MIN_GKE = "1.32.4-gke.1415000"
MULTI_TIER_KEY = "multiTierCheckpointing"
_GKE_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+)(?:-gke\.(\d+))?)?$")


@dataclass(frozen=True, kw_only=True)
class ClusterAccess:
    """Who reaches the control plane, and when GKE may upgrade the cluster."""

    authorized_networks: tuple[str, ...]  # CIDRs allowed to the IP endpoint; the DNS endpoint is IAM-gated
    maintenance_days: tuple[str, ...]  # weekly recurring maintenance window, in UTC
    maintenance_start_utc: str  # HH:MM
    maintenance_hours: int


# The GKE API's MasterAuthorizedNetworksConfig: "cidr_blocks define up to 50 external networks"
# (cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.clusters).
AUTHORIZED_NETWORKS_MAX = 50


def parse_access(section: Section) -> ClusterAccess:
    authorized = section.text_list("authorizedNetworks", ())
    if len(authorized) > AUTHORIZED_NETWORKS_MAX:
        raise ConfigError(f"{section.key('authorizedNetworks')} lists {len(authorized)} ranges; GKE takes at most "
                          f"{AUTHORIZED_NETWORKS_MAX}: merge them into wider ranges (the DNS endpoint needs none)")
    for cidr in authorized:
        try:
            network = ipaddress.ip_network(cidr)
        except ValueError:
            raise ConfigError(f"{section.key('authorizedNetworks')} holds {cidr!r}, not a CIDR range such as 203.0.113.0/24") from None
        if network.prefixlen == 0:
            raise ConfigError(f"{section.key('authorizedNetworks')} holds {cidr}, which opens the control plane to the "
                              "internet; list your own ranges (kubectl and pulumi also reach it through its DNS endpoint)")
    days = section.text_list("maintenanceDays", ("SA", "SU"))
    start = section.text("maintenanceStartUtc", "02:00")
    hours = section.integer("maintenanceHours", 6, minimum=_MAINTENANCE_HOURS_MIN, maximum=24)
    unknown = [day for day in days if day not in _DAYS]
    if unknown or not days or len(set(days)) != len(days):
        raise ConfigError(f"{section.key('maintenanceDays')} is {list(days)}; give distinct days among {', '.join(_DAYS)}")
    if not re.fullmatch(r"([01][0-9]|2[0-3]):[0-5][0-9]", start):
        raise ConfigError(f"{section.key('maintenanceStartUtc')} is {start!r}; give a time of day in UTC such as 02:00")
    if 4 * len(days) * hours < _MAINTENANCE_HOURS_IN_32_DAYS:
        raise ConfigError(
            f"{section.key('maintenanceDays')} x {section.key('maintenanceHours')} gives {4 * len(days) * hours} hours in "
            f"32 days; GKE needs at least {_MAINTENANCE_HOURS_IN_32_DAYS}: add days or hours"
        )
    return ClusterAccess(authorized_networks=authorized, maintenance_days=days, maintenance_start_utc=start,
                         maintenance_hours=hours)  # fmt: skip


def _gke_version(text: str) -> tuple[int, ...] | None:
    match = _GKE_VERSION.match(text)
    return None if match is None else tuple(int(part) for part in match.groups() if part is not None)


def check_cluster_version(key: str, version: str, *, queued_flex_start: bool) -> None:
    parsed = _gke_version(version)
    if parsed is None:
        raise ConfigError(f"{key} is {version!r}; give a GKE version such as 1.33 or 1.33.5-gke.1080000 (or leave it unset)")
    if queued_flex_start:
        floor = _gke_version(FLEX_START_QUEUED_MIN_GKE)
        # A shorter version (1.33) is any release of it: compare the parts it gives.
        if parsed < floor[: len(parsed)]:
            raise ConfigError(
                f"{key} is {version}, but flex-start TPU nodes through Kueue's queued provisioning need GKE "
                f"{FLEX_START_QUEUED_MIN_GKE} or later; raise it or leave it unset (the release channel's default)"
            )


@dataclass(frozen=True, kw_only=True)
class MultiTierCheckpointing:
    """gemma-tpu:cluster.multiTierCheckpointing: the cluster addon on, and the runs' local tier on its
    node volume, which the node's replicator backs up to a bucket every `backup_minutes`."""

    backup_minutes: int


def parse_multi_tier(cluster: Section) -> MultiTierCheckpointing | None:
    if cluster.raw(MULTI_TIER_KEY) is None:
        return None
    section = cluster.section(MULTI_TIER_KEY)
    minutes = section.integer("backupMinutes", 30, minimum=1)
    section.reject_unknown()
    return MultiTierCheckpointing(backup_minutes=minutes)


def check_multi_tier(cluster: Section, *, mode: str, version: str | None, slices: int) -> None:
    """What GKE's multi-tier checkpointing needs of the stack, each refused in one line."""
    key = cluster.key(MULTI_TIER_KEY)
    if mode == "autopilot":
        raise ConfigError(f"{key}: GKE's multi-tier checkpointing is not available on Autopilot clusters; set "
                          f"{cluster.key('mode')}: standard, or remove {MULTI_TIER_KEY}")
    if version is not None and _gke_version(version) is not None:
        parsed, floor = _gke_version(version), _gke_version(MULTI_TIER_MIN_GKE)
        if parsed < floor[: len(parsed)]:
            raise ConfigError(f"{cluster.key('version')} is {version}, but {key} needs GKE {MULTI_TIER_MIN_GKE} or later; "
                              "raise it or leave it unset (the release channel's default)")
    if slices < 2:
        raise ConfigError(f"{key}: GKE's multi-tier checkpointing replicates each host's checkpoint to the same host of "
                          "another slice, and its sources assume a job of two or more slices (node pools); this stack has "
                          f"one (gemma-tpu:tpu.slices): remove {MULTI_TIER_KEY} and keep gemma-tpu:training."
                          "localCheckpointInterval (the tier in host memory, docs/stacks.md)")
