"""gemma-tpu:monitoring: the dashboard, the alert policies' thresholds and where alerts go."""

import re
from dataclasses import dataclass

from infra.config.sections import Section
from infra.errors import ConfigError

# A Cloud Monitoring notification channel's resource name (`gcloud beta monitoring channels list`).
_NOTIFICATION_CHANNEL = re.compile(r"^projects/[a-z0-9-]+/notificationChannels/[0-9]+$")
# Alert windows: the trainer reports every few steps and GKE samples TPU metrics every 60 s, with a
# few minutes' delay; a shorter window alerts on noise. A condition's duration is at most a day.
ALERT_MINUTES = (5, 24 * 60)


@dataclass(frozen=True, kw_only=True)
class MonitoringConfig:
    """The stack's dashboard and alert policies (infra.observability.monitoring); each threshold is an alert's."""

    enabled: bool
    notification_channels: tuple[str, ...]  # where alerts go; none: they show in the console only
    restart_alert_count: int  # a run restarted more than this many times within a day
    low_utilization_percent: float  # a running trainer's TPU duty cycle below this ...
    low_utilization_minutes: int  # ... for this long: stuck or input-bound
    idle_nodes_minutes: int  # TPU nodes up this long with no trainer running


def parse_monitoring(section: Section) -> MonitoringConfig:
    enabled = section.flag("enabled", True)
    channels = section.text_list("notificationChannels", ())
    for channel in channels:
        if not _NOTIFICATION_CHANNEL.match(channel):
            raise ConfigError(
                f"{section.key('notificationChannels')} holds {channel!r}, not a channel such as "
                "projects/PROJECT/notificationChannels/123; list yours with `gcloud beta monitoring channels list`"
            )
    minutes = {"minimum": ALERT_MINUTES[0], "maximum": ALERT_MINUTES[1]}
    return MonitoringConfig(
        enabled=enabled,
        notification_channels=channels,
        restart_alert_count=section.integer("restartAlertCount", 3, minimum=0),
        low_utilization_percent=section.number("lowUtilizationPercent", 20.0, above=0.0, maximum=100.0),
        low_utilization_minutes=section.integer("lowUtilizationMinutes", 30, **minutes),
        idle_nodes_minutes=section.integer("idleNodesMinutes", 30, **minutes),
    )
