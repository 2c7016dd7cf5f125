"""gemma-tpu:storage: the data and artifacts buckets, and the training pods' cache of the data."""

import re

from infra.config.sections import Section
from infra.errors import ConfigError

# The training pods' cache of the data bucket (prepared TinyStories: about 2 GiB). It sits on the TPU
# node's boot disk (100 GB by default), beside the image.
DATA_CACHE_GIB_DEFAULT = 20
DATA_CACHE_GIB_MAX = 1000
# The cache volume is larger than the cache (the GCS FUSE driver's troubleshooting guide: a cache as
# large as its volume fails with "no space left on device"), and the trainer container has room of
# its own (logs, /tmp) besides; a training pod's ephemeral-storage request covers both, so the
# scheduler and Autopilot give the pod that much disk (and Kueue counts it).
CACHE_HEADROOM_GIB = 1
TRAINER_SCRATCH_GIB = 2
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")


def check_buckets(section: Section, data_bucket: str, artifacts_bucket: str) -> None:
    for key, bucket in ((section.key("dataBucket"), data_bucket), (section.key("artifactsBucket"), artifacts_bucket)):
        if not _BUCKET.match(bucket) or "google" in bucket or bucket.startswith("goog"):
            raise ConfigError(
                f"{key}: {bucket!r} is not a valid bucket name (3-63 of a-z, 0-9, '-', '_', '.', "
                "no 'google'); set a valid name there"
            )
    if data_bucket == artifacts_bucket:
        raise ConfigError(f"{section.key('artifactsBucket')} must differ from {section.key('dataBucket')}")
