"""`python -m tests.trainer.run.lone_host_run TRAINER_ARGS...`: `python -m trainer` on a TPU host outside any
cluster whose metadata server cannot be reached (a TPU VM outside GKE, a sandbox). There JAX's cluster
detection asks that server whether the host is part of a slice (jax._src.clusters.cloud_tpu_cluster.get_metadata)
and requests raises ConnectionError; here the detection raises it, every time it is asked. This process's CPU
devices stand in for the host's chips."""

import sys

import requests
from jax._src import clusters

from trainer.__main__ import main
from trainer.run import mesh


def _metadata_server_unreachable(cls, *args, **kwargs):
    raise requests.exceptions.ConnectionError(
        "HTTPConnectionPool(host='metadata.google.internal', port=80): Max retries exceeded with url: "
        "/computeMetadata/v1/instance/attributes/agent-worker-number (Caused by NameResolutionError: Failed to "
        "resolve 'metadata.google.internal')")


if __name__ == "__main__":
    clusters.ClusterEnv.auto_detect_unset_distributed_params = classmethod(_metadata_server_unreachable)
    mesh._accelerator_installed = lambda: True
    sys.exit(main(sys.argv[1:]))
