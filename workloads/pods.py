"""What every pod of the stack shares, training, data preparation and serving alike: the labels of its
objects, the GCS FUSE volumes its buckets are mounted by, its user and security settings. Pure
builders: plain Kubernetes dicts out (nothing here talks to a cluster)."""

from typing import Any

from infra.config import CACHE_HEADROOM_GIB

# pulumi-kubernetes otherwise waits for a Job to complete and fails the update after 10 minutes.
SKIP_AWAIT = {"pulumi.com/skipAwait": "true"}
_FUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
# The GCS FUSE sidecar keeps its file cache in this pod volume when it exists, on the node's disk,
# instead of in its own small ephemeral-storage allowance.
_FUSE_CACHE_VOLUME = "gke-gcsfuse-cache"
_LABEL = "app.kubernetes.io"


def object_labels(component: str, name: str) -> dict[str, str]:
    return {f"{_LABEL}/name": "gemma-tpu", f"{_LABEL}/component": component, f"{_LABEL}/instance": name}


def fuse_volume(name: str, bucket: str, *, uid: int, read_only: bool, cache_gib: int = 0) -> dict[str, Any]:
    """A GCS FUSE CSI ephemeral volume whose files belong to `uid`, cached on disk up to `cache_gib`.

    Mount options: the driver itself mounts with allow_other and default_permissions and keeps only
    rw and ro for the kernel; every other option is handed to gcsfuse as `--name=value`. So an
    `allow_other` here would become `--allow_other`, which gcsfuse has no flag for, and fail the
    mount (GoogleCloudPlatform/gcs-fuse-csi-driver pkg/util/util.go, mount options prepared for
    the kernel, and pkg/sidecar_mounter/sidecar_mounter.go, flags; the same from v1.4.0 to 2026).
    `uid=`/`gid=` are gcsfuse flags in every version (the driver's default is root).
    """
    attributes = {"bucketName": bucket, "mountOptions": f"uid={uid},gid={uid}"}
    if cache_gib:
        # Training data does not change during a run: cache whole files (also on the random reads
        # of the loader) and all their metadata. The metadata TTL stays at its default, so the
        # data wait sees the preparation marker appear instead of a cached "no such file".
        attributes |= {
            "fileCacheCapacity": f"{cache_gib}Gi",
            "fileCacheForRangeRead": "true",
            "metadataStatCacheCapacity": "-1",
            "metadataTypeCacheCapacity": "-1",
        }
    return {"name": name, "csi": {"driver": _FUSE_DRIVER, "readOnly": read_only, "volumeAttributes": attributes}}


def fuse_cache_volume(cache_gib: int) -> dict[str, Any]:
    """The sidecar's file cache volume, bounded: an emptyDir without a limit lets the cache fill
    the node's disk, and on Autopilot the pod is evicted once it passes its ephemeral storage."""
    return {"name": _FUSE_CACHE_VOLUME, "emptyDir": {"sizeLimit": f"{cache_gib + CACHE_HEADROOM_GIB}Gi"}}


def pod_metadata(labels: dict[str, str], *, evictable: bool) -> dict[str, Any]:
    annotations = {"gke-gcsfuse/volumes": "true"}
    if not evictable:
        annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] = "false"
    return {"labels": labels, "annotations": annotations}


def pod_security(uid: int) -> dict[str, Any]:
    """The pod's user and group. Root (the gemma-tpu:trainerRunsAsRoot fallback) still runs with
    every capability dropped: it only owns what root owns, such as the TPU device files."""
    # fsGroup: the GCS FUSE sidecar (its own non-root user) may write the cache volume; without it
    # it fails with "mkdir /gcsfuse-cache/.volumes: permission denied" (the driver's troubleshooting guide).
    return {"runAsNonRoot": uid != 0, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid}


CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def object_metadata(namespace: str, name: str, component: str, annotations: dict[str, str]) -> dict[str, Any]:
    metadata = {"name": name, "namespace": namespace, "labels": object_labels(component, name)}
    if annotations:
        metadata["annotations"] = annotations
    return metadata
