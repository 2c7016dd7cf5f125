"""IAM grants made by the stack: nothing public, nothing primitive, storage roles only on buckets,
and Workload Identity bindings that name exactly one Kubernetes service account."""

import json
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from rules.base import ResourceRule, as_list, is_mapping

PUBLIC_PRINCIPALS = ("allUsers", "allAuthenticatedUsers")
# Storage ACL resources name their grantee in these fields; predefined ACLs can imply allUsers.
ACL_ENTITY_FIELDS = {"entity"}
ACL_ENTITY_LIST_FIELDS = {"roleEntities"}
PREDEFINED_ACL_FIELDS = {"predefinedAcl", "defaultAcl"}
PUBLIC_PREDEFINED_ACLS = ("publicRead", "publicReadWrite")
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


def _may_grant(resource_type: str) -> bool:
    return resource_type.startswith("gcp:") and "remove" not in resource_type.lower()  # IAMMemberRemove revokes


def _policy_bindings(props: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    policy = props.get("policyData")  # *IAMPolicy: the whole policy as JSON
    if not isinstance(policy, str):
        return []
    try:
        bindings = json.loads(policy).get("bindings", [])
    except (json.JSONDecodeError, AttributeError):
        return []  # the provider rejects malformed policy data before anything is granted
    return [b for b in as_list(bindings) if is_mapping(b)]


def granted_roles(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """The roles a GCP IAM resource grants, read without touching its members (often unknown
    during preview: a new service account's email)."""
    if not _may_grant(resource_type):
        return []
    role = props.get("role")
    own = [role] if isinstance(role, str) and role.startswith("roles/") else []
    return own + [str(b.get("role", "")) for b in _policy_bindings(props)]


def iam_grants(resource_type: str, props: Mapping[str, Any]) -> list[Grant]:
    """The (role, members) pairs of *IAMMember (`member`), *IAMBinding (`members`), *IAMPolicy."""
    if not _may_grant(resource_type):
        return []
    grants = [Grant(str(b.get("role", "")), as_list(b.get("members"))) for b in _policy_bindings(props)]
    fields = set(props)  # iterating names reads no value, so an unknown one raises only if used
    if isinstance(props.get("role"), str) and fields & {"member", "members"}:
        members = [props["member"]] if "member" in fields else as_list(props["members"])
        grants.append(Grant(props["role"], members))
    return grants


def _is_public(principal: Any) -> bool:
    # ACL entities read "READER:allUsers"; IAM members read "allUsers".
    return isinstance(principal, str) and any(
        principal == p or principal.endswith(":" + p) for p in PUBLIC_PRINCIPALS
    )


def check_no_public_members(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    if not _may_grant(resource_type):
        return []
    fields = set(props)
    principals = [m for g in iam_grants(resource_type, props) for m in g.members]
    principals += [props[f] for f in ACL_ENTITY_FIELDS & fields] + [
        e for f in ACL_ENTITY_LIST_FIELDS & fields for e in as_list(props[f])
    ]
    problems = [
        f"grants access to {principal}; grant to a named service account or group instead"
        for principal in sorted({p for p in principals if _is_public(p)})
    ]
    problems += [
        f"{field}: {props[field]} makes it readable by allUsers; remove it and grant named principals through IAM"
        for field in sorted(PREDEFINED_ACL_FIELDS & fields)
        if props[field] in PUBLIC_PREDEFINED_ACLS
    ]
    return problems


def check_no_primitive_roles(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    return [
        f"grants the primitive role {role}; grant a predefined role with only the permissions "
        "needed (e.g. roles/storage.objectViewer on one bucket)"
        for role in granted_roles(resource_type, props)
        if role in PRIMITIVE_ROLES
    ]


def check_no_project_storage_roles(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    scope = PROJECT_WIDE_SCOPES.get(type_module(resource_type))
    if scope is None:
        return []
    return [
        f"grants {role} on the whole {scope}, i.e. on every bucket; grant it on "
        "the bucket that needs it (gcp.storage.BucketIAMMember)"
        for role in granted_roles(resource_type, props)
        if role.startswith(STORAGE_ROLE_PREFIX)
    ]


def check_workload_identity_bindings(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    if WORKLOAD_IDENTITY_USER not in granted_roles(resource_type, props):
        return []  # other grants' members (unknown during preview) are not this rule's business
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
    description="No allUsers / allAuthenticatedUsers IAM member or ACL entity (nor a public predefined ACL) on any GCP resource.",
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
