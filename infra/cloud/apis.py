"""The Google APIs the stack uses, enabled in the project and left enabled on destroy (other
things in the project may need them)."""

import pulumi_gcp as gcp

from infra.cloud.component import Component
from infra.config import StackConfig

SERVICES = (
    "artifactregistry.googleapis.com",
    "cloudresourcemanager.googleapis.com",  # project IAM bindings
    "compute.googleapis.com",
    "container.googleapis.com",
    "containerfilesystem.googleapis.com",  # image streaming on the node pools (infra.cloud.cluster)
    "iam.googleapis.com",
    "iamcredentials.googleapis.com",  # Workload Identity token exchange
    "logging.googleapis.com",  # log-based metrics (infra.observability.monitoring)
    "monitoring.googleapis.com",  # the dashboard and alert policies
    "storage.googleapis.com",
)


class ProjectApis(Component):
    """`services`: one enabled API each; everything else in the stack comes after them."""

    def __init__(self, name: str, config: StackConfig, opts=None):
        super().__init__("ProjectApis", name, opts=opts)
        self.services = [
            gcp.projects.Service(
                f"{service.split('.')[0]}-api",
                gcp.projects.ServiceArgs(
                    project=config.project, service=service, disable_on_destroy=False, disable_dependent_services=False
                ),
                opts=self.child(),
            )
            for service in SERVICES
        ]
        self.register_outputs({})
