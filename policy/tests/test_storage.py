import pytest

from rules.storage import BUCKET, check_bucket_access


def test_hardened_bucket_passes(graph_entry):
    assert check_bucket_access(BUCKET, graph_entry("data")["inputs"]) == []


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("uniformBucketLevelAccess", False, "uniformBucketLevelAccess"),
        ("uniformBucketLevelAccess", None, "uniformBucketLevelAccess"),
        ("publicAccessPrevention", "inherited", "publicAccessPrevention"),
        ("publicAccessPrevention", None, "publicAccessPrevention"),
    ],
)
def test_bucket_without_a_protection_is_reported_by_field(graph_entry, field, value, named):
    props = graph_entry("data")["inputs"]
    if value is None:
        del props[field]
    else:
        props[field] = value
    [problem] = check_bucket_access(BUCKET, props)
    assert named in problem


def test_other_resources_are_not_buckets(graph_entry):
    assert check_bucket_access("gcp:storage/bucketIAMMember:BucketIAMMember", graph_entry("trainer-data")["inputs"]) == []
