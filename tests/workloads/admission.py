"""What the real admission path refuses beyond the OpenAPI schemas, applied to rendered objects.

The schemas (tests/workloads/schemas.py) check field names and types. These rules live elsewhere:
in the API server's validation of built-in kinds, in the JobSet validating webhook, in the kubelet,
and in the GCS FUSE CSI driver and gcsfuse, which fail a mount only when a pod starts. Each rule
reads the rendered object alone and knows nothing of how our builders made it, so a builder that
drifts from a rule is caught here and not by `pulumi up`.

`violations(obj)` -> one line per problem, each starting with the rule's name (a key of RULES).
Upstream sources, at the versions read:
- Kubernetes v1.32: pkg/apis/batch/validation/validation.go (Job), pkg/apis/core/validation/
  validation.go (pod), staging/src/k8s.io/apimachinery/pkg/util/validation/validation.go (names).
- kubernetes-sigs/jobset v0.12.0 (f22e565a): pkg/webhooks/jobset_webhook.go (ValidateCreate) and
  the CRD's description of failurePolicy.rules[].name; api/jobset/v1alpha2/jobset_types.go.
- GoogleCloudPlatform/gcs-fuse-csi-driver, v1.4.0 (93ab38ce) to main (5fcdc04a, 2026-08):
  pkg/util/util.go PrepareSidecarMountOptions / prepareMountOptions (the kernel keeps only rw and
  ro and gets allow_other and default_permissions from the driver), pkg/sidecar_mounter/
  sidecar_mounter.go prepareMountCommand (every other option becomes `--name=value`),
  pkg/csi_driver/utils.go parseVolumeAttributes (volume attributes), docs/troubleshooting.md
  (custom cache volumes need fsGroup; the cache volume must be larger than the cache).
- GoogleCloudPlatform/gcsfuse main (7b392927, 2026-08): cfg/params.yaml (its flags; unknown ones
  are refused).
- kubernetes-sigs/kueue v0.19.2 (8eab6877): pkg/controller/jobframework/validation.go
  (ValidateQueueName: the queue-name label is a DNS-1123 subdomain; the priority class label may
  change on a running workload but not be added or removed), defaults.go (ApplyDefaultForSuspend:
  the webhook suspends a queued object itself), reconciler.go (Kueue writes spec.suspend when it
  admits or evicts), pkg/controller/admissionchecks/provisioning/provisioning.go (passProvReqParams:
  provreq.kueue.x-k8s.io/* annotations become ProvisioningRequest parameters, at most 255
  characters each: autoscaling.x-k8s.io/v1 Parameter); GKE's ProvisioningRequest docs
  (maxRunDurationSeconds, whole seconds, at most 7 days).
"""

import re
from collections.abc import Callable, Iterator
from typing import Any

Obj = dict[str, Any]
RULES: dict[str, Callable[[Obj], list[str]]] = {}

DNS_LABEL_MAX = 63
# apimachinery validation.go: IsDNS1123Label, IsDNS1035Label, IsValidLabelValue, IsValidPortName.
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_PORT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_PORT_NAME_MAX = 15
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")  # IsEnvVarName
# JobSet CRD, failurePolicy.rules[].name; the webhook refuses anything else.
_RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_RULE_NAME_MAX = 128
# JobSet jobset_types.go: the Job failure reasons a failure-policy rule may match.
_JOB_FAILURE_REASONS = {"BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes", "MaxFailedIndexesExceeded", "PodFailurePolicy"}
_RANDOM_POD_SUFFIX = "-abcde"  # the webhook counts a pod name with the 5 characters Kubernetes adds
# batch validation.go: the podFailurePolicy actions; pod-condition patterns need a qualified type
# name and a status (defaulted to True).
_POD_FAILURE_ACTIONS = {"Count", "FailIndex", "FailJob", "Ignore"}
_CONDITION_STATUSES = {"True", "False", "Unknown"}
_QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# batch validation.go: at most 20 podFailurePolicy rules, 255 exit codes a rule.
_POD_FAILURE_RULES_MAX = 20
_EXIT_CODES_MAX = 255

FUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
FUSE_CACHE_VOLUME = "gke-gcsfuse-cache"
# parseVolumeAttributes: the attributes the driver reads (any other is ignored without a word).
_FUSE_ATTRIBUTES = {
    "bucketName": str, "mountOptions": str,
    "fileCacheCapacity": "quantity", "metadataStatCacheCapacity": "quantity", "metadataTypeCacheCapacity": "quantity",
    "fileCacheForRangeRead": "bool", "skipCSIBucketAccessCheck": "bool", "disableMetrics": "bool",
    "metadataCacheTTLSeconds": "int", "gcsfuseLoggingSeverity": str,
}  # fmt: skip
# Options the driver keeps for the kernel mount; every other one is handed to gcsfuse as a flag.
_KERNEL_OPTIONS = {"rw", "ro"}
# gcsfuse flags (cfg/params.yaml) this project may pass; add one here only after checking it there.
_GCSFUSE_FLAGS = {"uid", "gid", "file-mode", "dir-mode", "implicit-dirs", "only-dir"}
# A Kubernetes quantity (apimachinery resource.ParseQuantity, the forms we write), or -1 for unbounded.
_QUANTITY = re.compile(r"^(-1|[0-9]+(\.[0-9]+)?([KMGTPE]i|[kMGTPE])?)$")
_BINARY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_TRUTH = {"1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"}  # Go strconv.ParseBool


def rule(name: str):
    def register(check: Callable[[Obj], list[str]]):
        RULES[name] = check
        return check

    return register


def violations(obj: Obj) -> list[str]:
    """Every rule's complaints about `obj`, each line prefixed with the rule's name."""
    return [f"{name}: {problem}" for name, check in RULES.items() for problem in check(obj)]


def _label(obj: Obj) -> str:
    return f"{obj.get('kind')} {obj.get('metadata', {}).get('name')!r}"


def _job_specs(obj: Obj) -> Iterator[tuple[str, Obj]]:
    """(where, Job spec) for a Job and for each replicated Job of a JobSet."""
    if obj.get("kind") == "Job":
        yield _label(obj), obj["spec"]
    elif obj.get("kind") == "JobSet":
        for rjob in obj["spec"].get("replicatedJobs", []):
            yield f"{_label(obj)} replicatedJob {rjob.get('name')!r}", rjob["template"]["spec"]


def _pods(obj: Obj) -> Iterator[tuple[str, Obj]]:
    for where, job in _job_specs(obj):
        yield where, job["template"]


def _containers(pod_spec: Obj) -> list[Obj]:
    return [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]


def _dns_label(what: str, value: Any, pattern: re.Pattern = _DNS1123_LABEL) -> list[str]:
    if not isinstance(value, str) or len(value) > DNS_LABEL_MAX or not pattern.match(value):
        return [f"{what} {value!r} is not a DNS label (at most {DNS_LABEL_MAX} of a-z, 0-9 and '-', alphanumeric at both ends)"]
    return []


@rule("names-are-dns-labels")
def _names(obj: Obj) -> list[str]:
    """Object names of these kinds, container, volume and port names (core validation.go)."""
    metadata = obj.get("metadata", {})
    problems = _dns_label(f"{_label(obj)}: name", metadata.get("name"))
    if "namespace" in metadata:
        problems += _dns_label(f"{_label(obj)}: namespace", metadata["namespace"])
    for where, pod in _pods(obj):
        spec = pod["spec"]
        for container in _containers(spec):
            problems += _dns_label(f"{where}: container name", container.get("name"))
            for port in container.get("ports", []):
                name = port.get("name", "")
                if len(name) > _PORT_NAME_MAX or not _PORT_NAME.match(name) or not re.search("[a-z]", name):
                    problems.append(f"{where}: port name {name!r} is not an IANA service name (at most {_PORT_NAME_MAX}, a letter)")
            for env in container.get("env", []):
                if not _ENV_NAME.match(env.get("name", "")):
                    problems.append(f"{where}: env name {env.get('name')!r} is not a valid variable name")
        for volume in spec.get("volumes", []):
            problems += _dns_label(f"{where}: volume name", volume.get("name"))
    return problems


@rule("labels-are-valid")
def _labels(obj: Obj) -> list[str]:
    """Label values: at most 63 characters, alphanumeric at both ends (IsValidLabelValue)."""
    labelled = [(_label(obj), obj.get("metadata", {}))] + [(w, p.get("metadata", {})) for w, p in _pods(obj)]
    return [
        f"{where}: label {key}={value!r} is not a label value (at most {DNS_LABEL_MAX} of A-Z, a-z, 0-9, '-', '_', '.')"
        for where, metadata in labelled
        for key, value in metadata.get("labels", {}).items()
        if not isinstance(value, str) or len(value) > DNS_LABEL_MAX or not _LABEL_VALUE.match(value)
    ]


@rule("job-name-fits-its-pod-label")
def _job_name(obj: Obj) -> list[str]:
    """A Job's name is the value of the batch.kubernetes.io/job-name label of its pods."""
    if obj.get("kind") != "Job":
        return []
    name = obj["metadata"]["name"]
    return [] if len(name) <= DNS_LABEL_MAX else [f"{_label(obj)}: name is {len(name)} characters, the job-name label allows {DNS_LABEL_MAX}"]


@rule("pod-failure-policy")
def _pod_failure_policy(obj: Obj) -> list[str]:
    """batch validation.go validatePodFailurePolicy: restartPolicy Never, known actions (FailIndex
    with backoffLimitPerIndex), one matcher a rule, pod conditions with a type and status, existing
    container names, no exit code 0 with In, codes unique and ascending, at most 20 rules of at most
    255 codes."""
    problems = []
    for where, job in _job_specs(obj):
        policy = job.get("podFailurePolicy")
        if policy is None:
            continue
        pod = job["template"]["spec"]
        if pod.get("restartPolicy") != "Never":
            problems.append(f"{where}: podFailurePolicy needs the pod's restartPolicy Never, not {pod.get('restartPolicy')!r}")
        rules = policy.get("rules", [])
        if len(rules) > _POD_FAILURE_RULES_MAX:
            problems.append(f"{where}: {len(rules)} podFailurePolicy rules, at most {_POD_FAILURE_RULES_MAX}")
        names = {c.get("name") for c in _containers(pod)}
        for index, policy_rule in enumerate(rules):
            action = policy_rule.get("action")
            if action not in _POD_FAILURE_ACTIONS:
                problems.append(f"{where}: podFailurePolicy rule {index} action {action!r} is not one of {sorted(_POD_FAILURE_ACTIONS)}")
            if action == "FailIndex" and "backoffLimitPerIndex" not in job:
                problems.append(f"{where}: podFailurePolicy rule {index} FailIndex requires backoffLimitPerIndex")
            if ("onExitCodes" in policy_rule) == ("onPodConditions" in policy_rule):
                problems.append(f"{where}: podFailurePolicy rule {index} needs exactly one of onExitCodes and onPodConditions")
            for pattern in policy_rule.get("onPodConditions", []):
                if not _QUALIFIED_NAME.match(pattern.get("type", "")) or pattern.get("status", "True") not in _CONDITION_STATUSES:
                    problems.append(f"{where}: podFailurePolicy rule {index} pod condition {pattern} needs a condition "
                                    f"type and a status of {sorted(_CONDITION_STATUSES)}")
            codes = policy_rule.get("onExitCodes")
            if codes is None:
                continue
            container = codes.get("containerName")
            if container is not None and container not in names:
                problems.append(f"{where}: podFailurePolicy rule {index} names container {container!r}, which the pod does not have")
            values = codes.get("values", [])
            if codes.get("operator") == "In" and 0 in values:
                problems.append(f"{where}: podFailurePolicy rule {index} matches exit code 0 with In")
            if values != sorted(set(values)) or not 0 < len(values) <= _EXIT_CODES_MAX:
                problems.append(f"{where}: podFailurePolicy rule {index} exit codes {values} are not 1-{_EXIT_CODES_MAX} unique ascending codes")
    return problems


@rule("pod-restart-policy")
def _restart_policy(obj: Obj) -> list[str]:
    """A Job's pods restart Never or OnFailure (batch validation.go)."""
    return [
        f"{where}: a Job's pod restartPolicy must be Never or OnFailure, not {pod['spec'].get('restartPolicy')!r}"
        for where, pod in _pods(obj)
        if pod["spec"].get("restartPolicy") not in ("Never", "OnFailure")
    ]


@rule("pod-references")
def _pod_references(obj: Obj) -> list[str]:
    """Container names unique in a pod, port names unique in a container and ports 1-65535
    (validateContainerPorts); every volumeMount names a volume of the pod (core validation.go)."""
    problems = []
    for where, pod in _pods(obj):
        spec = pod["spec"]
        names = [c.get("name") for c in _containers(spec)]
        problems += [f"{where}: container name {n!r} is used twice" for n in sorted({n for n in names if names.count(n) > 1})]
        for container in _containers(spec):
            ports = container.get("ports", [])
            port_names = [p.get("name") for p in ports if p.get("name")]
            problems += [f"{where}: port name {n!r} is used twice in container {container.get('name')!r}"
                         for n in sorted({n for n in port_names if port_names.count(n) > 1})]  # fmt: skip
            problems += [f"{where}: containerPort {p.get('containerPort')!r} is not 1-65535"
                         for p in ports if not isinstance(p.get("containerPort"), int) or not 0 < p["containerPort"] < 65536]  # fmt: skip
        volumes = {v.get("name") for v in spec.get("volumes", [])}
        problems += [
            f"{where}: container {c.get('name')!r} mounts volume {m.get('name')!r}, which the pod does not have"
            for c in _containers(spec)
            for m in c.get("volumeMounts", [])
            if m.get("name") not in volumes
        ]
    return problems


@rule("extended-resources")
def _extended_resources(obj: Obj) -> list[str]:
    """A resource outside kubernetes.io (google.com/tpu) is requested exactly as limited, as a
    whole number (core validation.go, extended resources cannot be overcommitted)."""
    problems = []
    for where, pod in _pods(obj):
        for container in _containers(pod["spec"]):
            resources = container.get("resources", {})
            requests, limits = resources.get("requests", {}), resources.get("limits", {})
            for name in sorted(set(requests) | set(limits)):
                if "/" not in name or name.startswith(("kubernetes.io/", "requests.")):
                    continue
                if requests.get(name, limits.get(name)) != limits.get(name) or not str(limits.get(name, "")).isdigit():
                    problems.append(
                        f"{where}: container {container.get('name')!r} {name} request {requests.get(name)!r} and limit "
                        f"{limits.get(name)!r} must be the same whole number"
                    )
    return problems


@rule("non-root-user")
def _non_root(obj: Obj) -> list[str]:
    """runAsNonRoot with runAsUser 0 passes the API server and fails every container start in the
    kubelet ("container's runAsUser breaks non-root policy")."""
    return [
        f"{where}: runAsNonRoot is true with runAsUser 0"
        for where, pod in _pods(obj)
        if pod["spec"].get("securityContext", {}).get("runAsNonRoot") is True
        and pod["spec"].get("securityContext", {}).get("runAsUser") == 0
    ]


def _jobset_names(obj: Obj) -> list[tuple[str, str]]:
    """(what, name) of the longest names the JobSet webhook derives (ValidateCreate)."""
    jobset = obj["metadata"]["name"]
    names = []
    for rjob in obj["spec"].get("replicatedJobs", []):
        last_job = f"{jobset}-{rjob['name']}-{rjob.get('replicas', 1) - 1}"
        names.append((f"the Job name {last_job!r}", last_job))
        job = rjob["template"]["spec"]
        if job.get("completionMode") == "Indexed" and "completions" in job:
            pod = f"{last_job}-{job['completions'] - 1}{_RANDOM_POD_SUFFIX}"
            names.append((f"the pod name {pod!r}", pod))
    return names


@rule("jobset-generated-names")
def _jobset_generated_names(obj: Obj) -> list[str]:
    """The longest generated Job and pod names are DNS-1035 labels."""
    if obj.get("kind") != "JobSet":
        return []
    problems = []
    for rjob in obj["spec"].get("replicatedJobs", []):
        problems += _dns_label(f"{_label(obj)}: replicatedJob name", rjob.get("name"), _DNS1035_LABEL)
    for what, name in _jobset_names(obj):
        problems += _dns_label(f"{_label(obj)}: {what}", name, _DNS1035_LABEL)
    return problems


@rule("jobset-coordinator")
def _jobset_coordinator(obj: Obj) -> list[str]:
    """spec.coordinator names an existing replicated job, job and pod (podIndex below completions,
    validateCoordinator), and its address
    `<jobset>-<rjob>-<job>-<pod>.<subdomain>` is a label value (the webhook sets it as one)."""
    if obj.get("kind") != "JobSet" or "coordinator" not in obj["spec"]:
        return []
    coordinator = obj["spec"]["coordinator"]
    rjobs = {r["name"]: r for r in obj["spec"].get("replicatedJobs", [])}
    rjob = rjobs.get(coordinator.get("replicatedJob"))
    if rjob is None:
        return [f"{_label(obj)}: coordinator replicatedJob {coordinator.get('replicatedJob')!r} does not exist"]
    problems = []
    job_index, pod_index = coordinator.get("jobIndex", 0), coordinator.get("podIndex", 0)
    if not 0 <= job_index < rjob.get("replicas", 1):
        problems.append(f"{_label(obj)}: coordinator jobIndex {job_index} is not below replicas {rjob.get('replicas', 1)}")
    job = rjob["template"]["spec"]
    if job.get("completionMode", "Indexed") != "Indexed" or "completions" not in job:
        problems.append(f"{_label(obj)}: the coordinator's replicatedJob must be Indexed with completions set")
    elif not 0 <= pod_index < job["completions"]:
        problems.append(f"{_label(obj)}: coordinator podIndex {pod_index} is not below completions {job['completions']}")
    subdomain = obj["spec"].get("network", {}).get("subdomain") or obj["metadata"]["name"]
    address = f"{obj['metadata']['name']}-{rjob['name']}-{job_index}-{pod_index}.{subdomain}"
    if len(address) > DNS_LABEL_MAX or not _LABEL_VALUE.match(address):
        problems.append(f"{_label(obj)}: coordinator address {address!r} is {len(address)} characters, a label value allows {DNS_LABEL_MAX}")
    return problems


@rule("jobset-failure-policy")
def _jobset_failure_policy(obj: Obj) -> list[str]:
    """Rule names match the CRD's pattern and are unique; reasons are Job failure reasons; message
    patterns are RE2 that compiles; targetReplicatedJobs exist."""
    if obj.get("kind") != "JobSet":
        return []
    rules = obj["spec"].get("failurePolicy", {}).get("rules", [])
    rjobs = {r["name"] for r in obj["spec"].get("replicatedJobs", [])}
    problems, seen = [], set()
    for policy_rule in rules:
        name = policy_rule.get("name", "")
        if len(name) > _RULE_NAME_MAX or not _RULE_NAME.match(name):
            problems.append(f"{_label(obj)}: failure policy rule name {name!r} must match {_RULE_NAME.pattern} (no hyphens)")
        if name in seen:
            problems.append(f"{_label(obj)}: failure policy rule name {name!r} is used twice")
        seen.add(name)
        problems += [
            f"{_label(obj)}: failure policy rule {name!r} matches {reason!r}, not a Job failure reason ({', '.join(sorted(_JOB_FAILURE_REASONS))})"
            for reason in policy_rule.get("onJobFailureReasons", [])
            if reason not in _JOB_FAILURE_REASONS
        ]
        # The webhook does not compile these: an invalid one is logged by the controller and never
        # matches (failure_policy.go). Python's re stands in for RE2 here (RE2 refuses lookarounds
        # and backreferences, which Python takes).
        for pattern in policy_rule.get("onJobFailureMessagePatterns", []):
            try:
                re.compile(pattern)
            except re.error as error:
                problems.append(f"{_label(obj)}: failure policy rule {name!r} message pattern {pattern!r} does not compile ({error})")
            if re.search(r"\(\?[=!<]|\\[1-9]", pattern):
                problems.append(f"{_label(obj)}: failure policy rule {name!r} message pattern {pattern!r} is not RE2 (lookaround or backreference)")
        problems += [
            f"{_label(obj)}: failure policy rule {name!r} targets replicatedJob {target!r}, which does not exist"
            for target in policy_rule.get("targetReplicatedJobs", [])
            if target not in rjobs
        ]
    return problems


QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
_PROVREQ_PREFIX = "provreq.kueue.x-k8s.io/"
_PROVREQ_PARAMETER_MAX = 255
_MAX_RUN_SECONDS = 7 * 24 * 3600
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@rule("kueue-queued-objects")
def _kueue_queued(obj: Obj) -> list[str]:
    """A Job or JobSet in a LocalQueue: queue and priority class labels that name objects (DNS-1123
    subdomains); no spec.suspend of its own (Kueue's webhook sets it, Kueue's controller flips it,
    and an object that set it too would conflict with Kueue's write on the next server-side apply,
    such as a changed priority); provreq annotations that GKE can take as parameters."""
    if obj.get("kind") not in ("Job", "JobSet"):
        return []
    metadata = obj.get("metadata", {})
    labels, annotations = metadata.get("labels", {}), metadata.get("annotations", {})
    problems = []
    for key in (QUEUE_LABEL, PRIORITY_LABEL):
        if key in labels and (len(labels[key]) > 253 or not _DNS1123_SUBDOMAIN.match(labels[key])):
            problems.append(f"{_label(obj)}: label {key}={labels[key]!r} is not an object name (DNS-1123 subdomain)")
    if PRIORITY_LABEL in labels and QUEUE_LABEL not in labels:
        problems.append(f"{_label(obj)}: label {PRIORITY_LABEL} without {QUEUE_LABEL}: Kueue does not manage it")
    if QUEUE_LABEL in labels and "suspend" in obj.get("spec", {}):
        problems.append(f"{_label(obj)}: a queued object sets spec.suspend, which Kueue owns once it admits the run: "
                        "the next server-side apply would conflict with Kueue")
    for key, value in annotations.items():
        if not key.startswith(_PROVREQ_PREFIX):
            continue
        if QUEUE_LABEL not in labels:
            problems.append(f"{_label(obj)}: annotation {key} on an object Kueue does not queue reaches no ProvisioningRequest")
        if not isinstance(value, str) or len(value) > _PROVREQ_PARAMETER_MAX:
            problems.append(f"{_label(obj)}: annotation {key} must be a string of at most {_PROVREQ_PARAMETER_MAX} characters")
        elif key == f"{_PROVREQ_PREFIX}maxRunDurationSeconds" and not (value.isdigit() and 0 < int(value) <= _MAX_RUN_SECONDS):
            problems.append(f"{_label(obj)}: {key}={value!r} must be whole seconds, at most {_MAX_RUN_SECONDS} (7 days)")
    return problems


def _fuse_volumes(pod: Obj) -> list[Obj]:
    return [v for v in pod["spec"].get("volumes", []) if v.get("csi", {}).get("driver") == FUSE_DRIVER]


def mount_option_problem(option: str) -> str | None:
    """What the driver and gcsfuse make of one `mountOptions` entry, if it fails the mount."""
    if option in _KERNEL_OPTIONS:
        return None
    if option.startswith("o="):
        return "is dropped by the driver unless it is a plain kernel flag such as noatime; allow_other is the driver's own"
    if ":" in option and "=" not in option:  # config-file style section:key:value
        return None if option.count(":") >= 2 else "is a config-file option without a section (section:key:value); use name=value"
    name = option.split("=", 1)[0]
    if name in _GCSFUSE_FLAGS:
        return None
    return f"would reach gcsfuse as --{option}, which is not a gcsfuse flag (the driver mounts with allow_other and default_permissions itself)"


def _gib(quantity: str) -> float | None:
    for suffix, factor in _BINARY_SUFFIXES.items():
        if quantity.endswith(suffix):
            return float(quantity.removesuffix(suffix)) * factor / 2**30
    return None


@rule("gcs-fuse-volumes")
def _gcs_fuse(obj: Obj) -> list[str]:
    """Volume attributes the driver reads, with values it parses; mount options that reach
    gcsfuse as flags it has; the pod annotation that injects the sidecar; a bounded file cache
    on a custom cache volume larger than it, which needs fsGroup so the sidecar can write it."""
    problems = []
    for where, pod in _pods(obj):
        volumes = _fuse_volumes(pod)
        if volumes and pod.get("metadata", {}).get("annotations", {}).get("gke-gcsfuse/volumes") != "true":
            problems.append(f"{where}: GCS FUSE volumes without the pod annotation gke-gcsfuse/volumes: \"true\" (no sidecar, no mount)")
        for volume in volumes:
            at = f"{where}: volume {volume['name']!r}"
            attributes = volume["csi"].get("volumeAttributes", {})
            if not attributes.get("bucketName"):
                problems.append(f"{at} has no bucketName")
            for key, value in attributes.items():
                kind = _FUSE_ATTRIBUTES.get(key)
                if kind is None:
                    problems.append(f"{at}: volume attribute {key!r} is not one the driver reads; it would be ignored")
                elif not isinstance(value, str):
                    problems.append(f"{at}: volume attribute {key} must be a string, got {value!r}")
                elif (kind == "quantity" and not _QUANTITY.match(value)) or (kind == "bool" and value not in _TRUTH) or (
                    kind == "int" and not re.fullmatch(r"-?[0-9]+", value)
                ):
                    problems.append(f"{at}: volume attribute {key}={value!r} is not a valid {kind}")
            for option in filter(None, attributes.get("mountOptions", "").split(",")):
                problem = mount_option_problem(option)
                if problem:
                    problems.append(f"{at}: mount option {option!r} {problem}")
            problems += _file_cache(at, pod, attributes.get("fileCacheCapacity"))
    return problems


def _file_cache(at: str, pod: Obj, capacity: str | None) -> list[str]:
    if capacity in (None, "0"):
        return []
    cache_volume = next((v for v in pod["spec"].get("volumes", []) if v.get("name") == FUSE_CACHE_VOLUME), None)
    if cache_volume is None:
        return []  # the sidecar's own ephemeral storage, bounded by its limit
    problems = []
    if pod["spec"].get("securityContext", {}).get("fsGroup") is None:
        problems.append(f"{at}: a custom {FUSE_CACHE_VOLUME} volume needs the pod's fsGroup, or the sidecar cannot create its cache there")
    size_limit = cache_volume.get("emptyDir", {}).get("sizeLimit")
    if "emptyDir" in cache_volume and (capacity == "-1" or size_limit is None):
        problems.append(f"{at}: an unbounded file cache ({capacity}) or cache emptyDir (sizeLimit {size_limit}) fills the node's disk")
    elif size_limit is not None and not (_gib(capacity) or 0) < (_gib(size_limit) or 0):
        problems.append(f"{at}: file cache {capacity} must be smaller than its volume's sizeLimit {size_limit}")
    return problems


# The serving objects' rules (Deployment, Service, PodMonitoring, HorizontalPodAutoscaler) register themselves.
from tests.workloads import admission_serving  # noqa: E402,F401
