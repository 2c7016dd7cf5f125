"""The stack's Kueue objects, as plain dicts: what runs wait in and what they may take.

- a ResourceFlavor per TPU shape of the stack, whose node labels are the ones the pools' nodes carry
  and the training pods select (StackConfig.tpu_node_selector, from the slice catalog);
- a ClusterQueue whose `google.com/tpu` quota is the pools' capacity (gemma-tpu:queue.tpuQuota may
  hold some back), admitting the training namespace only; a higher priority run may preempt a
  lower one, which resumes from its checkpoint when it is admitted again;
- the LocalQueue in the training namespace that every training Job / JobSet names in its
  `kueue.x-k8s.io/queue-name` label, and a WorkloadPriorityClass per priority;
- with flex-start capacity, a ProvisioningRequestConfig and the AdmissionCheck that makes Kueue ask
  GKE for the nodes (queued provisioning) when a run is queued; the pool goes back to zero after it.

Kueue admits a workload whole: every pod of every slice's Job counts at once against the quota, and
waitForPodsReady (on by default since Kueue v0.19) evicts and requeues an admitted run whose pods do
not all start. Pure and built once: infra.kueue applies them, the workload renderer prints them.
"""

from typing import Any

from infra.config import StackConfig
from infra.config.runs import PRIORITIES

KUEUE_API_VERSION = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
TPU_RESOURCE = "google.com/tpu"
LOCAL_QUEUE = "tpu"
PROVISIONING_CHECK = "flex-start"
# Kueue's own controller for ProvisioningRequest admission checks, and GKE's class for queued provisioning.
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
QUEUED_PROVISIONING_CLASS = "queued-provisioning.gke.io"
_NAMESPACE_LABEL = "kubernetes.io/metadata.name"  # set by Kubernetes on every namespace
# Nodes of a queued provisioning pool carry this taint (cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest).
QUEUED_NODE_TOLERATION = {"key": "cloud.google.com/gke-queued", "operator": "Exists", "effect": "NoSchedule"}
DISK_RESOURCE = "ephemeral-storage"


def cluster_queue_name(config: StackConfig) -> str:
    return config.cluster_name


def flavor_name(config: StackConfig) -> str:
    """e.g. v6e-2x4 (spot and flex-start nodes are another flavor of the same shape)."""
    capacity = "" if config.tpu.capacity in ("on-demand", "reservation") else f"-{config.tpu.capacity}"
    return f"{config.slice.accelerator}-{config.slice.topology}{capacity}"


def priority_class_name(priority: str) -> str:
    return f"gemma-tpu-{priority}"


def _object(kind: str, name: str, spec: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    metadata = {"name": name} if namespace is None else {"name": name, "namespace": namespace}
    return {"apiVersion": KUEUE_API_VERSION, "kind": kind, "metadata": metadata, "spec": spec}


def resource_flavor(config: StackConfig) -> dict[str, Any]:
    """The stack's TPU shape. Kueue copies its labels (and tolerations) into an admitted run's pods,
    which already select the same values, so admission changes nothing in them."""
    spec: dict[str, Any] = {"nodeLabels": config.tpu_node_selector}
    if config.queued_provisioning:
        spec["tolerations"] = [QUEUED_NODE_TOLERATION]
    return _object("ResourceFlavor", flavor_name(config), spec)


def cluster_queue(config: StackConfig) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "namespaceSelector": {"matchLabels": {_NAMESPACE_LABEL: config.namespace}},
        # A run that does not fit now does not hold back a smaller one behind it.
        "queueingStrategy": "BestEffortFIFO",
        # Kueue admits only what it covers: every resource the training pods request is here (the
        # chips and the pods' disk), each flavor's resources in the order of coveredResources.
        "resourceGroups": [{
            "coveredResources": [TPU_RESOURCE, DISK_RESOURCE],
            "flavors": [{"name": flavor_name(config), "resources": [
                {"name": TPU_RESOURCE, "nominalQuota": config.queue.tpu_quota},
                {"name": DISK_RESOURCE, "nominalQuota": f"{config.training_pod_disk_gib * config.total_hosts}Gi"},
            ]}],
        }],  # fmt: skip
        "preemption": {"withinClusterQueue": "LowerPriority"},
    }
    if config.queued_provisioning:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": PROVISIONING_CHECK}]}
    return _object("ClusterQueue", cluster_queue_name(config), spec)


def local_queue(config: StackConfig) -> dict[str, Any]:
    return _object("LocalQueue", LOCAL_QUEUE, {"clusterQueue": cluster_queue_name(config)}, namespace=config.namespace)


def priority_classes() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": KUEUE_API_VERSION,
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": priority_class_name(priority)},
            "value": value,
            "description": f"gemma-tpu:runs[].priority {priority}",
        }
        for priority, value in PRIORITIES.items()
    ]


def provisioning_objects(config: StackConfig) -> list[dict[str, Any]]:
    """With queued provisioning: the request's parameters, then the check that uses them."""
    if not config.queued_provisioning:
        return []
    request_config = _object(
        "ProvisioningRequestConfig", PROVISIONING_CHECK,
        {"provisioningClassName": QUEUED_PROVISIONING_CLASS, "managedResources": [TPU_RESOURCE]},
    )  # fmt: skip
    check = _object(
        "AdmissionCheck", PROVISIONING_CHECK,
        {"controllerName": PROVISIONING_CONTROLLER,
         "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig", "name": PROVISIONING_CHECK}},
    )  # fmt: skip
    return [request_config, check]


def queue_objects(config: StackConfig) -> list[dict[str, Any]]:
    """Every Kueue object of the stack in the order they are applied; none without gemma-tpu:queue."""
    if not config.queue.enabled:
        return []
    return [
        resource_flavor(config),
        *priority_classes(),
        *provisioning_objects(config),
        cluster_queue(config),
        local_queue(config),
    ]
