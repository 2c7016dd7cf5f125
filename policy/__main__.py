"""Entry point that `pulumi preview --policy-pack policy` runs: serves the pack over gRPC (blocks)."""

from pulumi_policy import EnforcementLevel, PolicyPack

from pack import DESCRIPTION, PACK_NAME, policies

PolicyPack(
    name=PACK_NAME,
    description=DESCRIPTION,
    policies=policies(),
    enforcement_level=EnforcementLevel.MANDATORY,
)
