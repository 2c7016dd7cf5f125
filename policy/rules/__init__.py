"""The gemma-tpu security rules as plain functions over (resource type, props) or the whole stack.

`pack.py` wraps each in a pulumi_policy Policy; `check.py` runs them on an offline preview graph.
"""

from rules.base import Resource, ResourceRule, StackRule, Violation
from rules.checkpointing import MULTI_TIER_VOLUMES_SERVED
from rules.gke import CLUSTER_WORKLOAD_IDENTITY, NODE_IDENTITY
from rules.network import CLUSTER_NETWORK, CONTROL_PLANE_ACCESS, PRIVATE_NODES
from rules.queue import QUOTA_WITHIN_CAPACITY, WORKLOADS_QUEUED
from rules.iam import NO_PRIMITIVE_ROLES, NO_PROJECT_STORAGE_ROLES, NO_PUBLIC_MEMBERS, WORKLOAD_IDENTITY_BINDINGS
from rules.storage import BUCKET_ACCESS
from rules.workloads import IMAGES_FROM_STACK_REGISTRY, PODS_UNPRIVILEGED
from rules.serving import MODEL_MOUNTS_READ_ONLY, SERVER_IMAGES_PINNED, SERVICES_NOT_PUBLIC

RESOURCE_RULES: tuple[ResourceRule, ...] = (
    BUCKET_ACCESS,
    NO_PUBLIC_MEMBERS,
    NO_PRIMITIVE_ROLES,
    NO_PROJECT_STORAGE_ROLES,
    NODE_IDENTITY,
    CLUSTER_WORKLOAD_IDENTITY,
    PRIVATE_NODES,
    CONTROL_PLANE_ACCESS,
    CLUSTER_NETWORK,
    WORKLOAD_IDENTITY_BINDINGS,
    PODS_UNPRIVILEGED,
    MODEL_MOUNTS_READ_ONLY,
    SERVICES_NOT_PUBLIC,
)
STACK_RULES: tuple[StackRule, ...] = (IMAGES_FROM_STACK_REGISTRY, WORKLOADS_QUEUED, QUOTA_WITHIN_CAPACITY, SERVER_IMAGES_PINNED,
                                      MULTI_TIER_VOLUMES_SERVED)

__all__ = ["RESOURCE_RULES", "STACK_RULES", "Resource", "ResourceRule", "StackRule", "Violation"]
