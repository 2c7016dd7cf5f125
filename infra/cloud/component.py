"""The base of this program's components: a named group whose children wait for what it follows."""

from collections.abc import Sequence

import pulumi

from infra.config import PROJECT


class Component(pulumi.ComponentResource):
    """A `pulumi.ComponentResource` of type `gemma-tpu:infra:<kind>`.

    Pulumi does not pass a component's `depends_on` down to its children, so a component keeps
    the resources it must come `after` (e.g. the enabled APIs) and gives them to every child.
    """

    def __init__(self, kind: str, name: str, *, after: Sequence[pulumi.Resource] = (), opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{PROJECT}:infra:{kind}", name, None, opts)
        self._after = list(after)

    def child(self, *depends_on: pulumi.Resource, **options) -> pulumi.ResourceOptions:
        """Options for a child: parented here, after this component's prerequisites and `depends_on`."""
        return pulumi.ResourceOptions(parent=self, depends_on=[*self._after, *depends_on], **options)


def service_account_member(account) -> pulumi.Output[str]:
    """The IAM member string of a `gcp.serviceaccount.Account`."""
    return account.email.apply(lambda email: f"serviceAccount:{email}")
