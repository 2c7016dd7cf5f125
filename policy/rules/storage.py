"""Buckets: IAM-only access (no per-object ACLs) and no way to make them public."""

from collections.abc import Mapping
from typing import Any

from rules.base import ResourceRule

BUCKET = "gcp:storage/bucket:Bucket"


def check_bucket_access(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    if resource_type != BUCKET:
        return []
    problems = []
    if props.get("uniformBucketLevelAccess") is not True:
        problems.append(
            "bucket must set uniformBucketLevelAccess: true "
            "(gcp.storage.Bucket(uniform_bucket_level_access=True)) so access is IAM-only"
        )
    if props.get("publicAccessPrevention") != "enforced":
        problems.append(
            'bucket must set publicAccessPrevention: "enforced" '
            '(gcp.storage.Bucket(public_access_prevention="enforced")) so it can never be made public'
        )
    return problems


BUCKET_ACCESS = ResourceRule(
    name="buckets-uniform-access-public-prevention",
    description="Buckets have uniform bucket-level access and public access prevention enforced.",
    check=check_bucket_access,
)
