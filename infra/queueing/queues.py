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
not all start. Pure and built once: infra.queueing.kueue applies them, the workload renderer prints them.
"""

from typing import Any

from infra.config import StackConfig
from infra.config.runs import PRIORITIES
from infra.config.slices import trainer_memory_gib

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
# The taints of a queued provisioning TPU pool's nodes: GKE's queued-provisioning taint
# (cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest) and every TPU node's
# google.com/tpu=present. GKE adds the TPU toleration to Pods that request chips, but not to the
# PodTemplate that Kueue builds for the ProvisioningRequest from the run's pod set and the flavor
# (kueue v0.19.2 pkg/controller/admissionchecks/provisioning/controller.go createPodTemplate), so
# the flavor carries both (Google's TPU v6e queued-provisioning example, GoogleCloudPlatform/
# cluster-toolkit examples/gke-consumption-options/dws-flex-start-queued-provisioning).
QUEUED_NODE_TOLERATIONS = (
    {"key": "cloud.google.com/gke-queued", "operator": "Exists", "effect": "NoSchedule"},
    {"key": TPU_RESOURCE, "operator": "Equal", "value": "present", "effect": "NoSchedule"},
)
DISK_RESOURCE = "ephemeral-storage"
MEMORY_RESOURCE = "memory"
# The ProvisioningRequest parameter that asks GKE for a slice of this topology (the same example).
TPU_TOPOLOGY_PARAMETER = "tpu-topology"
# Kueue passes a queued object's provreq.kueue.x-k8s.io/* annotations to its ProvisioningRequest as
# parameters (kueue v0.19.2 pkg/controller/admissionchecks/provisioning/provisioning.go
# passProvReqParams); GKE keeps flex-start nodes for maxRunDurationSeconds, at most 7 days
# (cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest; Google's TPU example sets it
# on the JobSet). A run that outlasts it is disrupted, resumes from its checkpoint and asks again.
MAX_RUN_ANNOTATION = "provreq.kueue.x-k8s.io/maxRunDurationSeconds"
FLEX_START_MAX_RUN_SECONDS = 7 * 24 * 3600


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
        spec["tolerations"] = [dict(toleration) for toleration in QUEUED_NODE_TOLERATIONS]
    return _object("ResourceFlavor", flavor_name(config), spec)


def _quotas(config: StackConfig) -> list[dict[str, Any]]:
    """Every resource a training pod requests, for all the hosts of the pools at once."""
    quotas = [
        {"name": TPU_RESOURCE, "nominalQuota": config.queue.tpu_quota},
        {"name": DISK_RESOURCE, "nominalQuota": f"{config.training_pod_disk_gib * config.total_hosts}Gi"},
    ]
    memory_gib = trainer_memory_gib(config.slice, config.cluster_mode)
    if memory_gib is not None:
        quotas.append({"name": MEMORY_RESOURCE, "nominalQuota": f"{memory_gib * config.total_hosts}Gi"})
    return quotas


def cluster_queue(config: StackConfig) -> dict[str, Any]:
    quotas = _quotas(config)
    spec: dict[str, Any] = {
        "namespaceSelector": {"matchLabels": {_NAMESPACE_LABEL: config.namespace}},
        # A run that does not fit now does not hold back a smaller one behind it.
        "queueingStrategy": "BestEffortFIFO",
        # Kueue admits only what it covers: every resource the training pods request is here (the
        # chips, the pods' disk and, on Standard, their memory), each flavor's resources in the order of coveredResources.
        "resourceGroups": [{
            "coveredResources": [quota["name"] for quota in quotas],
            "flavors": [{"name": flavor_name(config), "resources": quotas}],
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
        {"provisioningClassName": QUEUED_PROVISIONING_CLASS, "managedResources": [TPU_RESOURCE],
         "parameters": {TPU_TOPOLOGY_PARAMETER: config.slice.topology}},
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
