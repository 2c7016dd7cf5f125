"""The training objects, and every object of the stack's runs in the order they are applied. Pure
builders: a RunSpec in, plain Kubernetes dicts out (nothing here talks to a cluster). What every pod
shares is workloads.pods; the data preparation Job, workloads.preparation.

Shapes: one host -> a batch/v1 Job; one multi-host slice -> a JobSet with one Job of `hosts` pods;
N slices -> the same JobSet with `replicas: N` and exclusive placement, one slice's Job per node
pool. Autopilot gets the same objects: pods find TPU nodes by the catalog's node selectors only
(no node pool names), which is also all a Standard cluster needs, except for a reservation: its
pods select the node pools bound to it (spec.tpu_node_pools).

Data before training: the data preparation Job (workloads.preparation) writes its output with a marker file in it, renamed
into place when complete (trainer.contract.PREPARED_MARKER_FILE). Every training container first
waits for that marker on its read-only data mount, then execs the trainer. This ordering holds for
every shape (a batch/v1 Job has no JobSet `dependsOn`), however the objects are applied (`pulumi up`
or `kubectl apply` of the rendered YAML), and after every restart (the marker is there: no wait).
The wait is in the trainer's container, not an init container, so a waiting pod is Ready: Kueue's
waitForPodsReady (on by default since v0.19, 30 minutes: kueue v0.19.2 apis/config/v1beta2/
defaults.go) would otherwise evict and requeue a queued run that waits longer for its data, and
give back its flex-start nodes. `pulumi up` additionally awaits the preparation Job before it
creates the training objects, so a failed download fails the update.

Failure semantics (exit codes from trainer.contract, see spec.RETRYABLE_EXIT_CODES; the table
in docs/workloads.md): a disruption (preemption, eviction, node shutdown: the pod's DisruptionTarget
condition) restarts the run from its last checkpoint without spending a restart; the trainer's
RETRY code restarts it, at most `max_restarts` times; any other exit (a code or config error, an
OOM kill) fails the run at once. A batch/v1 Job counts restarts in `backoffLimit`; a JobSet's Jobs
have `backoffLimit: 0` and the JobSet restarts them as a whole.
"""

from collections.abc import Sequence
from typing import Any

from infra.catalog.names import NODE_POOL_LABEL, SLICE_JOB, TRAINER_CONTAINER
from infra.cloud import checkpointing
from infra.cloud.accounts import namespace_object, service_account_object
from infra.queueing.queues import MAX_RUN_ANNOTATION, PRIORITY_LABEL, QUEUE_LABEL
from trainer import contract
from workloads.pods import (
    CONTAINER_SECURITY,
    SKIP_AWAIT,
    fuse_cache_volume,
    fuse_volume,
    object_labels,
    object_metadata,
    pod_metadata,
    pod_security,
)
from workloads.preparation import preparation_jobs
from workloads.spec import (
    ARTIFACTS_MOUNT,
    DATA_MOUNT,
    LOCAL_CHECKPOINT_MOUNT,
    PREPARE_DEADLINE_SECONDS,
    PROFILE_PORT,
    RETRYABLE_EXIT_CODES,
    TERMINATION_GRACE_SECONDS,
    TPU_METRICS_PORT,
    RunSpec,
)

JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
# JobSet failure-policy rule names match ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$: no hyphens
# (the CRD's description of failurePolicy.rules[].name; the validating webhook enforces it).
FAIL_ON_ERRORS_RULE = "FailOnNonRetryableExit"
RESTART_ON_DISRUPTION_RULE = "RestartOnDisruption"
# The pod condition that the scheduler (preemption), the Eviction API (drain, node upgrade), the
# taint manager, the pod garbage collector (node gone) and the kubelet (graceful node shutdown, as
# on a Spot reclaim; node-pressure eviction) set on a pod they stop.
DISRUPTION_CONDITION = "DisruptionTarget"
# The Job controller's failure message for a pod-condition rule is "Pod NS/NAME has condition TYPE
# matching ACTION rule at index N" (kubernetes pkg/controller/job/pod_failure_policy.go); JobSet
# searches it with this RE2 pattern (jobset pkg/controllers/failure_policy.go, regexp.MatchString).
DISRUPTION_MESSAGE_PATTERN = f"^Pod [^ ]+ has condition {DISRUPTION_CONDITION} matching FailJob rule"
EXCLUSIVE_TOPOLOGY = {"alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}
_POLL_SECONDS = 10

# The image's entrypoint (trainer/Dockerfile), run once the prepared data is there.
_TRAINER_COMMAND = ("python", "-m", "trainer")
# With a local checkpoint tier, the trainer runs under trainer.supervise, which restarts a crashed trainer
# inside the pod, so the restart finds the tier's volume (a restart of the pod would lose it).
_SUPERVISED_COMMAND = ("python", "-m", "trainer.supervise", "--", *_TRAINER_COMMAND)
_LOCAL_CHECKPOINT_VOLUME = "local-checkpoints"


def _wait_then_train(spec: RunSpec) -> list[str]:
    """The trainer container's command: wait for the prepared data's marker (exit USER_ERROR past
    the preparation's deadline, naming the preparation Job), then exec the trainer with the
    container's args."""
    give_up = (
        f"echo \"error: {spec.prepared_marker} did not appear within {PREPARE_DEADLINE_SECONDS} s: "
        f"see kubectl logs -n {spec.namespace} job/{spec.prepare_name}\" >&2; exit {contract.USER_ERROR}"
    )
    script = (
        f"timeout {PREPARE_DEADLINE_SECONDS} sh -c 'until [ -f \"$0\" ]; do sleep {_POLL_SECONDS}; done' "
        f"{spec.prepared_marker} || {{ {give_up}; }}; exec {' '.join(_trainer_command(spec))} \"$@\""
    )
    return ["sh", "-c", script, TRAINER_CONTAINER]


def _trainer_command(spec: RunSpec) -> tuple[str, ...]:
    return _TRAINER_COMMAND if spec.local_checkpoint_gib is None else _SUPERVISED_COMMAND


def _local_checkpoint_volume(spec: RunSpec) -> dict[str, Any]:
    """The local tier's volume: host memory (tmpfs), bounded. Its pages count against the trainer
    container's memory limit, which infra.config.runs checks it fits in with the trainer. On a
    multi-tier checkpointing stack: GKE's inline CSI volume (no attributes), the node's RAM disk that
    the CheckpointConfiguration sizes (infra.cloud.checkpointing), which outlives the pod."""
    if spec.multi_tier_backup_minutes is not None:
        return {"name": _LOCAL_CHECKPOINT_VOLUME, "csi": {"driver": checkpointing.CSI_DRIVER}}
    return {"name": _LOCAL_CHECKPOINT_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": f"{spec.local_checkpoint_gib}Gi"}}


def _trainer_env(spec: RunSpec) -> list[dict[str, Any]]:
    env = [{"name": name, "value": value} for name, value in spec.trainer_env.items()]
    if spec.multislice:
        # JAX's multislice setup: this pod's slice is its Job's index in the JobSet, and the
        # coordinator is the JobSet's designated pod (spec.coordinator), by its stable DNS name.
        env += [
            {"name": "MEGASCALE_SLICE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/job-index']"}}},
            {"name": "MEGASCALE_COORDINATOR_ADDRESS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['jobset.sigs.k8s.io/coordinator']"}}},
        ]  # fmt: skip
    if spec.multi_tier_backup_minutes is not None:
        # Orbax names the run's backups after the JobSet (trainer.multitier.replicated).
        env.append({"name": "JOBSET_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['jobset.sigs.k8s.io/jobset-name']"}}})
    return env


def _node_pool_affinity(pools: tuple[str, ...]) -> dict[str, Any]:
    """Pods that must land on these node pools (one for each slice's Job); nothing for none."""
    if not pools:
        return {}
    term = {"matchExpressions": [{"key": NODE_POOL_LABEL, "operator": "In", "values": list(pools)}]}
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}}


def _trainer_pod(spec: RunSpec) -> dict[str, Any]:
    resources = {"google.com/tpu": str(spec.chips_per_host), "ephemeral-storage": f"{spec.pod_disk_gib}Gi"}
    if spec.trainer_memory_gib is not None:
        resources["memory"] = f"{spec.trainer_memory_gib}Gi"  # see infra.catalog.tpu.SliceSpec.trainer_memory_gib
    trainer = {
        "name": TRAINER_CONTAINER,
        "image": spec.image,
        "command": _wait_then_train(spec),
        "args": list(spec.trainer_args),
        "env": _trainer_env(spec),
        "resources": {"requests": resources, "limits": resources},
        "volumeMounts": [
            {"name": "data", "mountPath": DATA_MOUNT, "readOnly": True},
            {"name": "artifacts", "mountPath": ARTIFACTS_MOUNT},
        ],
        "securityContext": CONTAINER_SECURITY,
        "ports": [{"name": "tpu-metrics", "containerPort": TPU_METRICS_PORT}],
    }
    if spec.profiling:
        trainer["ports"].append({"name": "profiler", "containerPort": PROFILE_PORT})
    volumes = [
        fuse_volume("data", spec.data_bucket, uid=spec.trainer_uid, read_only=True, cache_gib=spec.data_cache_gib),
        fuse_volume("artifacts", spec.artifacts_bucket, uid=spec.trainer_uid, read_only=False),
        fuse_cache_volume(spec.data_cache_gib),
    ]
    node_selector = dict(spec.tpu_node_selector)
    if spec.local_checkpoint_gib is not None:
        trainer["volumeMounts"].append({"name": _LOCAL_CHECKPOINT_VOLUME, "mountPath": LOCAL_CHECKPOINT_MOUNT})
        volumes.append(_local_checkpoint_volume(spec))
    if spec.multi_tier_backup_minutes is not None:
        # JAX's coordinator, which the node's rank server names in jax-init-info.txt; the nodes whose
        # driver serves the volume (the CheckpointConfiguration's selector).
        trainer["ports"].append({"name": "jax-coordinator", "containerPort": checkpointing.COORDINATOR_PORT})
        node_selector |= spec.multi_tier_node_selector
    return {
        "metadata": pod_metadata(object_labels("train", spec.name), evictable=False),
        "spec": {
            "serviceAccountName": spec.service_account,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
            "nodeSelector": node_selector,
            **_node_pool_affinity(spec.tpu_node_pools),
            "securityContext": pod_security(spec.trainer_uid),
            "containers": [trainer],
            "volumes": volumes,
        },
    }


def _pod_failure_policy(on_disruption: str) -> dict[str, Any]:
    """A disrupted pod (DisruptionTarget: preempted, evicted, its node shut down or gone) gets
    `on_disruption`, whatever its exit code; otherwise the Job fails at once when the trainer (or its
    data wait) exits with a non-retryable code. Rules are tried in order, the first match wins."""
    return {
        "rules": [
            {"action": on_disruption, "onPodConditions": [{"type": DISRUPTION_CONDITION, "status": "True"}]},
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": TRAINER_CONTAINER, "operator": "NotIn", "values": sorted(RETRYABLE_EXIT_CODES)},
            },
        ]
    }


def _queued(spec: RunSpec, training_object: dict[str, Any]) -> dict[str, Any]:
    """A queued run names its LocalQueue and priority; Kueue's webhook creates it suspended
    (jobframework ApplyDefaultForSuspend), starts it once the quota admits all of its pods at once
    and suspends it again if a higher priority run preempts it. `spec.suspend` is Kueue's alone:
    an object that set it would, once Kueue had started the run, conflict with Kueue's write on
    the next server-side apply (a changed priority, say) and fail `pulumi up`. With queued
    provisioning it also bounds how long GKE keeps the run's nodes (MAX_RUN_ANNOTATION)."""
    if spec.queue is not None:
        training_object["metadata"]["labels"] |= {QUEUE_LABEL: spec.queue, PRIORITY_LABEL: spec.priority_class}
    if spec.max_run_seconds is not None:
        metadata = training_object["metadata"]
        metadata["annotations"] = {**metadata.get("annotations", {}), MAX_RUN_ANNOTATION: str(spec.max_run_seconds)}
    return training_object


def namespace(spec: RunSpec) -> dict[str, Any]:
    """The namespace of the run (created by infra.cloud.identity on `pulumi up`, from the same builder)."""
    return namespace_object(spec.namespace)


def service_accounts(spec: RunSpec) -> list[dict[str, Any]]:
    """The pods' ServiceAccounts, training's then data preparation's, each acting as its own
    Google account (created by infra.cloud.identity on `pulumi up`, from the same builder)."""
    return [
        service_account_object(spec.service_account, namespace=spec.namespace, google_service_account=spec.google_service_account),
        service_account_object(spec.prepare_service_account, namespace=spec.namespace,
                               google_service_account=spec.prepare_google_service_account),
    ]  # fmt: skip


def training_job(spec: RunSpec) -> dict[str, Any]:
    """One host: a batch/v1 Job that retries retryable failures up to `max_restarts` times."""
    return _queued(spec, {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": object_metadata(spec.namespace, spec.name, "train", SKIP_AWAIT),
        "spec": {
            "backoffLimit": spec.max_restarts,
            # A disruption replaces the pod without spending a restart.
            "podFailurePolicy": _pod_failure_policy("Ignore"),
            "template": _trainer_pod(spec),
        },
    })


def training_jobset(spec: RunSpec) -> dict[str, Any]:
    """Multi-host or multislice: one Job per slice, `hosts_per_slice` indexed pods each."""
    slice_job = {
        "parallelism": spec.hosts_per_slice,
        "completions": spec.hosts_per_slice,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        # Every failure fails the slice's Job; the JobSet's rules tell a disruption from an error
        # by the Job's failure message.
        "podFailurePolicy": _pod_failure_policy("FailJob"),
        "template": _trainer_pod(spec),
    }
    jobset_spec: dict[str, Any] = {
        "failurePolicy": {
            "maxRestarts": spec.max_restarts,
            # A Job failed on a disruption restarts the JobSet without spending a restart; one failed
            # on a non-retryable exit ends the run; any other failed Job (a retryable exit, past
            # backoffLimit 0) restarts the whole JobSet, counted against maxRestarts.
            "rules": [
                {"name": RESTART_ON_DISRUPTION_RULE, "action": "RestartJobSetAndIgnoreMaxRestarts",
                 "onJobFailureReasons": ["PodFailurePolicy"], "onJobFailureMessagePatterns": [DISRUPTION_MESSAGE_PATTERN]},
                {"name": FAIL_ON_ERRORS_RULE, "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]},
            ],  # fmt: skip
        },
        "replicatedJobs": [{"name": SLICE_JOB, "replicas": spec.slices, "template": {"spec": slice_job}}],
    }
    if spec.multislice:
        jobset_spec["coordinator"] = {"replicatedJob": SLICE_JOB, "jobIndex": 0, "podIndex": 0}
    return _queued(spec, {
        "apiVersion": JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": object_metadata(spec.namespace, spec.name, "train", EXCLUSIVE_TOPOLOGY if spec.exclusive_pools else {}),
        "spec": jobset_spec,
    })


def training(spec: RunSpec) -> dict[str, Any]:
    """The training object of the spec's shape."""
    return training_job(spec) if spec.shape == "job" else training_jobset(spec)


def all_objects(specs: Sequence[RunSpec], cluster_objects: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Every object of the stack's runs in the order they are applied: the namespace and its
    ServiceAccounts, the cluster's objects the runs need (multi-tier checkpointing's configuration,
    infra.cloud.checkpointing; the queue, infra.queueing.queues), data preparation, then each run's
    training object."""
    first = specs[0]
    return [namespace(first), *service_accounts(first), *cluster_objects, *preparation_jobs(specs), *map(training, specs)]


def logs_command(spec: RunSpec) -> str:
    """kubectl command that follows the trainer's log (of the first pod of the first slice)."""
    if spec.shape == "job":
        return f"kubectl logs -n {spec.namespace} -f job/{spec.name} -c {TRAINER_CONTAINER}"
    first_pod = f"jobset.sigs.k8s.io/jobset-name={spec.name},jobset.sigs.k8s.io/job-index=0,batch.kubernetes.io/job-completion-index=0"
    return f"kubectl logs -n {spec.namespace} -f -l {first_pod} -c {TRAINER_CONTAINER}"


def status_command(spec: RunSpec) -> str:
    kind = "job" if spec.shape == "job" else "jobset"
    return f"kubectl get {kind} {spec.name} -n {spec.namespace}"