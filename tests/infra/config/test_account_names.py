"""The service account names derived from the stack name and `gemma-tpu:serviceAccount` stay
within Google's (6-30 characters) and Kubernetes' (63) limits, for the longest names accepted."""

import re

import pytest

from infra.config import STACK_NAME_MAX, parse_stack_config
from infra.errors import ConfigError
from tests.infra.conftest import stack_values

GOOGLE_ACCOUNT_ID = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")


def test_the_longest_stack_name_gives_valid_distinct_google_account_ids():
    stack = "s" * STACK_NAME_MAX
    config = parse_stack_config(stack_values("dev"), stack)
    ids = {config.node_service_account_id, config.training_service_account_id, config.preparation_service_account_id}
    assert len(ids) == 3
    assert all(GOOGLE_ACCOUNT_ID.match(account_id) for account_id in ids), ids
    with pytest.raises(ConfigError, match=f"^the stack name '{stack}s' must be at most {STACK_NAME_MAX} characters"):
        parse_stack_config(stack_values("dev"), stack + "s")


def test_the_preparation_service_account_fits_beside_the_longest_training_one():
    accepted = "t" * 58
    config = parse_stack_config(stack_values("dev", **{"gemma-tpu:serviceAccount": accepted}), "dev")
    assert len(config.preparation_service_account) <= 63 and config.preparation_service_account != accepted
    with pytest.raises(ConfigError, match=r"^gemma-tpu:serviceAccount 't{59}' must be at most 58 characters"):
        parse_stack_config(stack_values("dev", **{"gemma-tpu:serviceAccount": accepted + "t"}), "dev")
