"""The Kubernetes objects that give pods their Google identity, as plain dicts: the namespace and a
ServiceAccount annotated with the Google service account it acts as (Workload Identity).

Pure and built once: infra.cloud.identity applies them with the cluster's provider, and the workload
renderer prints the same objects for review.
"""

from typing import Any

WORKLOAD_IDENTITY_ANNOTATION = "iam.gke.io/gcp-service-account"


def namespace_object(name: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def service_account_object(name: Any, *, namespace: Any, google_service_account: Any) -> dict[str, Any]:
    """`google_service_account` is the account's email (a plain string, or a Pulumi output)."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {WORKLOAD_IDENTITY_ANNOTATION: google_service_account},
        },
    }
