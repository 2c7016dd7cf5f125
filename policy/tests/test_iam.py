import json

import pytest

from rules.iam import (
    check_no_primitive_roles,
    check_no_project_storage_roles,
    check_no_public_members,
    check_workload_identity_bindings,
)

PROJECT_MEMBER = "gcp:projects/iAMMember:IAMMember"
PROJECT_BINDING = "gcp:projects/iAMBinding:IAMBinding"
PROJECT_POLICY = "gcp:projects/iAMPolicy:IAMPolicy"
BUCKET_MEMBER = "gcp:storage/bucketIAMMember:BucketIAMMember"
SA_MEMBER = "gcp:serviceaccount/iAMMember:IAMMember"
SA_BINDING = "gcp:serviceaccount/iAMBinding:IAMBinding"
TRAINER_SA = "serviceAccount:gemma-tpu-dev-trainer@my-project.iam.gserviceaccount.com"


def policy_data(role: str, *members: str) -> str:
    return json.dumps({"bindings": [{"role": role, "members": list(members)}]})


def test_the_compliant_graph_grants_nothing_public_primitive_or_project_wide(compliant_graph):
    for entry in compliant_graph:
        for check in (check_no_public_members, check_no_primitive_roles, check_no_project_storage_roles,
                      check_workload_identity_bindings):
            assert check(entry["type"], entry["inputs"]) == [], (check.__name__, entry["name"])


@pytest.mark.parametrize(
    ("resource_type", "props", "principal"),
    [
        (BUCKET_MEMBER, {"bucket": "b", "role": "roles/storage.objectViewer", "member": "allUsers"}, "allUsers"),
        (BUCKET_MEMBER, {"bucket": "b", "role": "roles/storage.objectViewer", "members": ["allAuthenticatedUsers"]},
         "allAuthenticatedUsers"),
        ("gcp:storage/bucketAccessControl:BucketAccessControl", {"bucket": "b", "entity": "allUsers", "role": "READER"},
         "allUsers"),
        ("gcp:storage/bucketACL:BucketACL", {"bucket": "b", "roleEntities": ["READER:allUsers"]}, "READER:allUsers"),
        (PROJECT_POLICY, {"project": "p", "policyData": policy_data("roles/logging.viewer", "allUsers")}, "allUsers"),
    ],
)
def test_public_principals_are_reported_wherever_they_appear(resource_type, props, principal):
    [problem] = check_no_public_members(resource_type, props)
    assert principal in problem


@pytest.mark.parametrize("field", ["predefinedAcl", "defaultAcl"])
@pytest.mark.parametrize("acl", ["publicRead", "publicReadWrite"])
def test_a_public_predefined_acl_is_reported(field, acl):
    [problem] = check_no_public_members("gcp:storage/bucketACL:BucketACL", {"bucket": "b", field: acl})
    assert f"{field}: {acl}" in problem


def test_a_named_principal_is_not_public():
    props = {"bucket": "b", "role": "roles/storage.objectViewer", "member": "group:allusers-team@example.com"}
    assert check_no_public_members(BUCKET_MEMBER, props) == []


@pytest.mark.parametrize("role", ["roles/owner", "roles/editor", "roles/viewer"])
@pytest.mark.parametrize(
    ("resource_type", "props"),
    [
        (PROJECT_MEMBER, {"project": "p", "member": TRAINER_SA}),
        (BUCKET_MEMBER, {"bucket": "b", "member": TRAINER_SA}),
        (PROJECT_BINDING, {"project": "p", "members": [TRAINER_SA]}),
    ],
)
def test_primitive_roles_are_reported_at_any_scope(resource_type, props, role):
    [problem] = check_no_primitive_roles(resource_type, {**props, "role": role})
    assert role in problem


def test_primitive_role_inside_policy_data_is_reported():
    props = {"project": "p", "policyData": policy_data("roles/editor", TRAINER_SA)}
    [problem] = check_no_primitive_roles(PROJECT_POLICY, props)
    assert "roles/editor" in problem


def test_revoking_a_primitive_role_is_not_a_grant():
    props = {"project": "p", "role": "roles/editor", "member": TRAINER_SA}
    assert check_no_primitive_roles("gcp:projects/iAMMemberRemove:IAMMemberRemove", props) == []


@pytest.mark.parametrize(
    "resource_type",
    [PROJECT_MEMBER, PROJECT_BINDING, "gcp:folder/iAMMember:IAMMember", "gcp:organizations/iAMMember:IAMMember"],
)
def test_storage_roles_on_a_project_or_above_are_reported(resource_type):
    props = {"project": "p", "role": "roles/storage.objectAdmin", "member": TRAINER_SA, "members": [TRAINER_SA]}
    [problem] = check_no_project_storage_roles(resource_type, props)
    assert "roles/storage.objectAdmin" in problem and "BucketIAMMember" in problem


def test_storage_role_on_a_bucket_passes(graph_entry):
    entry = graph_entry("trainer-data")
    assert check_no_project_storage_roles(entry["type"], entry["inputs"]) == []


def test_project_role_that_is_not_storage_passes(graph_entry):
    entry = graph_entry("nodes-log-writer")
    assert check_no_project_storage_roles(entry["type"], entry["inputs"]) == []


def test_one_ksa_on_one_google_service_account_passes(graph_entry):
    entry = graph_entry("trainer-wi")
    assert check_workload_identity_bindings(entry["type"], entry["inputs"]) == []


@pytest.mark.parametrize(
    "member",
    [
        "serviceAccount:my-project.svc.id.goog[training/*]",
        "serviceAccount:my-project.svc.id.goog[training]",
        "serviceAccount:my-project.svc.id.goog",
        "serviceAccount:gemma-tpu-dev-trainer@my-project.iam.gserviceaccount.com",
        "principalSet://iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/my-project.svc.id.goog/*",
    ],
)
def test_workload_identity_member_must_name_one_namespace_and_ksa(graph_entry, member):
    props = graph_entry("trainer-wi")["inputs"] | {"member": member}
    [problem] = check_workload_identity_bindings(SA_MEMBER, props)
    assert member in problem


def test_workload_identity_binding_with_two_ksas_is_reported():
    props = {
        "serviceAccountId": "projects/p/serviceAccounts/t@p.iam.gserviceaccount.com",
        "role": "roles/iam.workloadIdentityUser",
        "members": ["serviceAccount:p.svc.id.goog[training/a]", "serviceAccount:p.svc.id.goog[training/b]"],
    }
    [problem] = check_workload_identity_bindings(SA_BINDING, props)
    assert "2 members" in problem


def test_workload_identity_user_on_the_project_is_reported():
    props = {"project": "p", "role": "roles/iam.workloadIdentityUser", "member": "serviceAccount:p.svc.id.goog[training/a]"}
    [problem] = check_workload_identity_bindings(PROJECT_MEMBER, props)
    assert "gcp.serviceaccount.IAMMember" in problem
