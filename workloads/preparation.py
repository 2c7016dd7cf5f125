"""The data preparation Job: `python -m trainer.data.prepare` in the trainer image on a CPU node, which
downloads (or mounts) a run's raw dataset and tokenizes it into the data bucket. It writes its output
with a marker file in it, renamed into place when complete (trainer.contract.PREPARED_MARKER_FILE),
which every training container waits for (workloads.manifests). Runs of one dataset and preparation
share one Job. Pure builders: a RunSpec in, plain Kubernetes dicts out."""

from collections.abc import Sequence
from typing import Any

from trainer import contract
from trainer.contract import TRAINER_UID
from workloads.pods import CONTAINER_SECURITY, fuse_volume, object_labels, object_metadata, pod_metadata, pod_security
from workloads.spec import DATA_MOUNT, PREPARE_DEADLINE_SECONDS, RunSpec

PREPARE_CONTAINER = "prepare"
_SOURCE_MOUNT = "/source"  # a gs:// dataset's bucket, read-only, in the preparation pod
_SCRATCH_MOUNT = "/scratch"  # a downloaded dataset, in the preparation pod
_PREPARE_CPUS = 2
_PREPARE_MEMORY = "4Gi"
_PREPARE_SCRATCH = "10Gi"  # the raw text (TinyStories: ~2 GB); 10Gi is also within Autopilot limits
_PREPARE_RETRIES = 2  # a transient download or GCS error; safe, preparation is idempotent
# `python -m trainer.data.prepare` in the trainer image, whose entrypoint is the trainer's. Idempotent: a
# complete output (its marker) ends it before any download.
_PREPARE_COMMAND = ("python", "-m", "trainer.data.prepare")


def _dataset_source(spec: RunSpec) -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """The --input arguments, volumes and mounts of the raw dataset: a URL, downloaded into the
    scratch volume; an object in the data bucket, through the data mount; one in another bucket,
    through a read-only mount of that bucket."""
    if not spec.dataset.startswith("gs://"):
        scratch = {"name": "scratch", "emptyDir": {"sizeLimit": _PREPARE_SCRATCH}}
        mount = {"name": "scratch", "mountPath": _SCRATCH_MOUNT}
        return ["--input", spec.dataset, "--download-dir", _SCRATCH_MOUNT], [scratch], [mount]
    bucket, _, path = spec.dataset.removeprefix("gs://").partition("/")
    if bucket == spec.data_bucket:
        return ["--input", f"{DATA_MOUNT}/{path}"], [], []
    volume = fuse_volume("source", bucket, uid=TRAINER_UID, read_only=True)  # read once, start to end: no cache
    mount = {"name": "source", "mountPath": _SOURCE_MOUNT, "readOnly": True}
    return ["--input", f"{_SOURCE_MOUNT}/{path}"], [volume], [mount]


def preparation_job(spec: RunSpec) -> dict[str, Any]:
    """The data preparation Job on a CPU node: download (or mount) the corpus and tokenize it
    into `spec.prepared_dir` of the data bucket, unless that is already complete."""
    source_args, source_volumes, source_mounts = _dataset_source(spec)
    # The official tokenizer: the one the trainer reads the prepared data with (every model but tiny).
    # trainer.data.prepare writes `spec.prepared_path` with its marker, contract.PREPARED_MARKER_FILE, last.
    args = [*source_args, *spec.preparation_flags, "--tokenizer", "official", "--output", spec.prepared_path,
            "--workers", str(_PREPARE_CPUS)]  # fmt: skip
    resources = {"cpu": str(_PREPARE_CPUS), "memory": _PREPARE_MEMORY, "ephemeral-storage": _PREPARE_SCRATCH}
    container = {
        "name": PREPARE_CONTAINER,
        "image": spec.image,
        "command": list(_PREPARE_COMMAND),
        "args": args,
        "resources": {"requests": resources, "limits": resources},
        "volumeMounts": [{"name": "data", "mountPath": DATA_MOUNT}, *source_mounts],
        "securityContext": CONTAINER_SECURITY,
    }
    pod = {
        "metadata": pod_metadata(object_labels("prepare", spec.prepare_name), evictable=True),
        "spec": {
            "serviceAccountName": spec.prepare_service_account,
            "restartPolicy": "Never",
            "nodeSelector": dict(spec.cpu_node_selector),
            "securityContext": pod_security(TRAINER_UID),
            "containers": [container],
            "volumes": [fuse_volume("data", spec.data_bucket, uid=TRAINER_UID, read_only=False), *source_volumes],
        },
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": object_metadata(spec.namespace, spec.prepare_name, "prepare", {}),
        "spec": {
            "backoffLimit": _PREPARE_RETRIES,
            "activeDeadlineSeconds": PREPARE_DEADLINE_SECONDS,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {"containerName": PREPARE_CONTAINER, "operator": "In", "values": [contract.USER_ERROR]},
                    }
                ]
            },
            "template": pod,
        },
    }


def preparation_jobs(specs: Sequence[RunSpec]) -> list[dict[str, Any]]:
    """One data preparation Job per dataset: runs of the same dataset share its prepared data."""
    # Runs of one preparation key have the same dataset and preparation, hence the same Job.
    by_name = {spec.prepare_name: spec for spec in specs}
    return [preparation_job(spec) for spec in by_name.values()]

