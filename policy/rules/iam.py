"""IAM grants made by the stack: nothing public, nothing primitive, storage roles only on buckets,
and Workload Identity bindings that name exactly one Kubernetes service account."""

import json
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from rules.base import ResourceRule, as_list, is_mapping

PUBLIC_PRINCIPALS = ("allUsers", "allAuthenticatedUsers")
PRIMITIVE_ROLES = ("roles/owner", "roles/editor", "roles/viewer")
STORAGE_ROLE_PREFIX = "roles/storage."
WORKLOAD_IDENTITY_USER = "roles/iam.workloadIdentityUser"
# Type-token modules whose IAM resources grant on a whole project (or more), and what they grant on.
PROJECT_WIDE_SCOPES = {"projects": "project", "folder": "folder", "organizations": "organization"}
SERVICE_ACCOUNT_MODULE = "serviceaccount"
# serviceAccount:PROJECT.svc.id.goog[NAMESPACE/KSA]; the project may carry a "domain:" prefix.
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_KSA_MEMBER = re.compile(
    rf"^serviceAccount:[a-z0-9][a-z0-9.:-]*\.svc\.id\.goog\[{_DNS_LABEL}/{_DNS_LABEL}(\.{_DNS_LABEL})*\]$"
)


class Grant(NamedTuple):
    role: str
    members: list[str]


def type_module(resource_type: str) -> str:
    """ "gcp:projects/iAMMember:IAMMember" -> "projects"."""
    parts = resource_type.split(":")
    return parts[1].split("/")[0] if len(parts) == 3 else ""


def iam_grants(resource_type: str, props: Mapping[str, Any]) -> list[Grant]:
    """The (role, members) pairs a GCP IAM resource grants: *IAMMember, *IAMBinding, *IAMPolicy."""
    if not resource_type.startswith("gcp:") or "remove" in resource_type.lower():
        return []  # IAMMemberRemove revokes, it grants nothing
    grants = []
    role = props.get("role")
    if isinstance(role, str) and ("member" in props or "members" in props):
        members = [props["member"]] if "member" in props else as_list(props["members"])
        grants.append(Grant(role, members))
    policy = props.get("policyData")
    if isinstance(policy, str):
        try:
            bindings = json.loads(policy).get("bindings", [])
        except (json.JSONDecodeError, AttributeError):
            bindings = []  # the provider rejects malformed policy data before anything is granted
        grants += [Grant(b.get("role", ""), as_list(b.get("members"))) for b in bindings if is_mapping(b)]
    return grants


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if is_mapping(value):
        return [s for item in value.values() for s in _strings(item)]
    return [s for item in as_list(value) for s in _strings(item)]


def _is_public(principal: str) -> bool:
    # ACL entities read "READER:allUsers"; IAM members read "allUsers".
    return any(principal == p or principal.endswith(":" + p) for p in PUBLIC_PRINCIPALS)


def check_no_public_members(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    if not resource_type.startswith("gcp:"):
        return []
    found = {s for s in _strings(props) if _is_public(s)}
    found |= {m for g in iam_grants(resource_type, props) for m in g.members if _is_public(m)}
    return [
        f"grants access to {principal}; grant to a named service account or group instead"
        for principal in sorted(found)
    ]


def check_no_primitive_roles(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    return [
        f"grants the primitive role {g.role}; grant a predefined role with only the permissions "
        "needed (e.g. roles/storage.objectViewer on one bucket)"
        for g in iam_grants(resource_type, props)
        if g.role in PRIMITIVE_ROLES
    ]


def check_no_project_storage_roles(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    scope = PROJECT_WIDE_SCOPES.get(type_module(resource_type))
    if scope is None:
        return []
    return [
        f"grants {g.role} on the whole {scope}, i.e. on every bucket; grant it on "
        "the bucket that needs it (gcp.storage.BucketIAMMember)"
        for g in iam_grants(resource_type, props)
        if g.role.startswith(STORAGE_ROLE_PREFIX)
    ]


def check_workload_identity_bindings(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    problems = []
    for grant in iam_grants(resource_type, props):
        if grant.role != WORKLOAD_IDENTITY_USER:
            continue
        if type_module(resource_type) != SERVICE_ACCOUNT_MODULE:
            problems.append(
                f"grants {WORKLOAD_IDENTITY_USER} through {resource_type}; grant it on the one "
                "Google service account the pods use (gcp.serviceaccount.IAMMember)"
            )
        if len(grant.members) != 1:
            problems.append(
                f"{WORKLOAD_IDENTITY_USER} binding has {len(grant.members)} members; it must name "
                "exactly one Kubernetes service account"
            )
        problems += [
            f"{WORKLOAD_IDENTITY_USER} member {member!r} must read "
            "serviceAccount:PROJECT.svc.id.goog[NAMESPACE/KSA] (one namespace, one service account)"
            for member in grant.members
            if not (isinstance(member, str) and _KSA_MEMBER.match(member))
        ]
    return problems


NO_PUBLIC_MEMBERS = ResourceRule(
    name="no-public-iam-members",
    description="No allUsers / allAuthenticatedUsers member or ACL entity on any GCP resource.",
    check=check_no_public_members,
)
NO_PRIMITIVE_ROLES = ResourceRule(
    name="no-primitive-roles",
    description="The stack grants no primitive role (roles/owner, roles/editor, roles/viewer).",
    check=check_no_primitive_roles,
)
NO_PROJECT_STORAGE_ROLES = ResourceRule(
    name="no-project-level-storage-roles",
    description="Storage roles are granted on buckets, never on the project, folder or organization.",
    check=check_no_project_storage_roles,
)
WORKLOAD_IDENTITY_BINDINGS = ResourceRule(
    name="workload-identity-binding-one-ksa",
    description=(
        "Every roles/iam.workloadIdentityUser grant is on one Google service account and names "
        "exactly one serviceAccount:PROJECT.svc.id.goog[NAMESPACE/KSA] member."
    ),
    check=check_workload_identity_bindings,
)
