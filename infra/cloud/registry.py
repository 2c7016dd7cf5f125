"""The Artifact Registry repository for the trainer image, pullable by the GKE nodes."""

from collections.abc import Sequence

import pulumi
import pulumi_gcp as gcp

from infra.cloud.component import Component, service_account_member
from infra.config import StackConfig

KEEP_RECENT_VERSIONS = 10
DELETE_OLDER_THAN = "2592000s"  # 30 days; the most recent versions above are kept regardless


class Registry(Component):
    """`repository` and `url` (`REGION-docker.pkg.dev/PROJECT/REPOSITORY`, what image names start with)."""

    def __init__(self, name: str, config: StackConfig, node_service_account: gcp.serviceaccount.Account, *, after: Sequence[pulumi.Resource] = (), opts=None):
        super().__init__("Registry", name, after=after, opts=opts)
        self.repository = gcp.artifactregistry.Repository(
            "trainer-images",
            gcp.artifactregistry.RepositoryArgs(
                repository_id=config.cluster_name,
                location=config.region,
                format="DOCKER",
                description=f"Trainer images of the {config.stack} stack",
                cleanup_policy_dry_run=False,
                cleanup_policies=[
                    gcp.artifactregistry.RepositoryCleanupPolicyArgs(
                        id="keep-recent",
                        action="KEEP",
                        most_recent_versions=gcp.artifactregistry.RepositoryCleanupPolicyMostRecentVersionsArgs(
                            keep_count=KEEP_RECENT_VERSIONS
                        ),
                    ),
                    gcp.artifactregistry.RepositoryCleanupPolicyArgs(
                        id="delete-old",
                        action="DELETE",
                        condition=gcp.artifactregistry.RepositoryCleanupPolicyConditionArgs(
                            tag_state="ANY", older_than=DELETE_OLDER_THAN
                        ),
                    ),
                ],
            ),
            opts=self.child(protect=config.protect),
        )
        self.node_reader = gcp.artifactregistry.RepositoryIamMember(
            "nodes-pull-images",
            gcp.artifactregistry.RepositoryIamMemberArgs(
                repository=self.repository.repository_id,
                location=config.region,
                role="roles/artifactregistry.reader",
                member=service_account_member(node_service_account),
            ),
            opts=self.child(),
        )
        self.url = self.repository.repository_id.apply(
            lambda repository_id: f"{config.region}-docker.pkg.dev/{config.project}/{repository_id}"
        )
        self.register_outputs({"url": self.url})
