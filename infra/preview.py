"""`python -m infra.preview --stack NAME [--json]`: what `pulumi up` would register, offline.

Runs the project's `__main__.py` under Pulumi's mock runtime with the config of
`Pulumi.NAME.yaml` and prints every resource: type, name, parent, its inputs as the provider
would receive them (camelCase), what it waits for, and whether `pulumi destroy` would refuse it
(`protected`) or leave it in the cloud (`kept on destroy`). No credentials, no network, no Pulumi CLI.
Values only the cloud knows (a cluster's endpoint, an account's email, an image's digest) are
filled in with recognisable placeholders.
An invalid config exits with code 2 and its one-line message.
"""

import asyncio
import json
import runpy
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi.output import Unknown
from pulumi.runtime import mocks, rpc, settings

from infra.config import PROJECT
from infra.config.stack_files import PLACEHOLDER_PROJECT, PROJECT_ROOT, offline_values
from infra.errors import ConfigError
from trainer.errors import OneLineParser, UserError

PROGRAM = PROJECT_ROOT / "__main__.py"
PLACEHOLDER_DNS_ENDPOINT = "gke-0123456789abcdef-000000000000.us-east5.gke.goog"  # a cluster's DNS endpoint form
PLACEHOLDER_DIGEST = "sha256:" + "0" * 64  # of an image build, known only after the push
PLACEHOLDER_PROJECT_NUMBER = "123456789012"  # the project's number, which only the API knows
PLACEHOLDER_DASHBOARD_ID = "PLACEHOLDER-DASHBOARD-ID"  # assigned by Monitoring on creation
COMPUTED = "<computed>"  # a value only the provider knows after creating the resource
USER_ERROR = 2


@dataclass(frozen=True, kw_only=True)
class Resource:
    type: str
    name: str
    parent: str | None  # the parent's name; None for children of the stack itself
    inputs: dict[str, Any]
    provider: str | None = None  # the explicit provider's name ("gcp", "gke"); None for components
    depends_on: tuple[str, ...] = ()  # names of what it waits for, explicit and through its inputs
    urn: str = ""
    dependency_urns: tuple[str, ...] = ()  # depends_on exactly: a name can repeat across types
    protect: bool = False  # `pulumi destroy` refuses to delete it
    retain_on_delete: bool = False  # `pulumi destroy` drops it from the stack but leaves it in the cloud

    def as_dict(self) -> dict[str, Any]:
        """The --json form: the keys the issues promise (the provider shows in text)."""
        return {"type": self.type, "name": self.name, "parent": self.parent, "inputs": self.inputs, "dependsOn": list(self.depends_on)}


class _CloudPlaceholders(pulumi.runtime.Mocks):
    """Each resource's state is its inputs plus the few outputs the program reads."""

    def __init__(self, project: str):
        self.project = project

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        state = dict(args.inputs)
        if args.typ == "gcp:serviceaccount/account:Account":
            email = f"{args.inputs['accountId']}@{self.project}.iam.gserviceaccount.com"
            state.update(email=email, name=f"projects/{self.project}/serviceAccounts/{email}")
        elif args.typ == "gcp:container/cluster:Cluster":
            endpoints = dict(args.inputs.get("controlPlaneEndpointsConfig") or {})
            endpoints["dnsEndpointConfig"] = {**endpoints.get("dnsEndpointConfig", {}), "endpoint": PLACEHOLDER_DNS_ENDPOINT}
            state.update(controlPlaneEndpointsConfig=endpoints)
        elif args.typ == "gcp:storage/bucket:Bucket":
            state.update(url=f"gs://{args.inputs['name']}")
        elif args.typ == "docker-build:index:Image":
            # The pushed reference pods run, so that the training objects show in full.
            state.update(ref=f"{args.inputs['tags'][0]}@{PLACEHOLDER_DIGEST}")
        elif args.typ == "gcp:monitoring/dashboard:Dashboard":
            # The provider's ID of a dashboard; Monitoring picks the last part.
            return f"projects/{self.project}/dashboards/{PLACEHOLDER_DASHBOARD_ID}", state
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs):
        if args.token == "gcp:organizations/getProject:getProject":  # the project number an IAM principal names
            return {"projectId": self.project, "number": PLACEHOLDER_PROJECT_NUMBER}
        return {}


@dataclass(frozen=True, kw_only=True)
class Registration:
    """One resource as the engine would receive it from the program."""

    urn: str
    type: str
    name: str
    parent_urn: str
    inputs: dict[str, Any]
    provider_urn: str  # the explicit provider's URN, "" for the default one
    dependency_urns: tuple[str, ...]
    protect: bool
    retain_on_delete: bool
    custom_timeouts: Any


class _RecordingMonitor(mocks.MockMonitor):
    """The mock monitor, also remembering each registration in order."""

    def __init__(self, mocks_impl: pulumi.runtime.Mocks):
        super().__init__(mocks_impl)
        self.registrations: list[Registration] = []

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            self.registrations.append(
                Registration(
                    urn=response.urn,
                    type=request.type,
                    name=request.name,
                    parent_urn=request.parent,
                    inputs=rpc.deserialize_properties(request.object),
                    provider_urn=request.provider.rsplit("::", 1)[0] if request.provider else "",
                    dependency_urns=tuple(request.dependencies),
                    protect=request.protect,
                    retain_on_delete=request.retainOnDelete,
                    custom_timeouts=request.customTimeouts,
                )
            )
        return response


def record(program: Callable[[], Any], mocks_impl: pulumi.runtime.Mocks, *, stack: str, preview: bool,
           config: Mapping[str, str] | None = None) -> list[Registration]:
    """Runs `program` under a fresh Pulumi mock runtime (`config`: the engine's string values) and
    returns every registration in order. Errors of the program propagate (pulumi.RunError)."""
    monitor = _RecordingMonitor(mocks_impl)
    settings.set_root_resource(None)  # set_mocks then starts a fresh stack, without earlier runs' exports
    # Pulumi runs on the current event loop; an earlier asyncio.run() in this process (Orbax, grain) leaves none.
    asyncio.set_event_loop(asyncio.new_event_loop())
    pulumi.runtime.set_mocks(monitor.mocks, project=PROJECT, stack=stack, preview=preview, monitor=monitor)
    pulumi.runtime.set_all_config(dict(config or {}), [])
    pulumi.runtime.test(lambda: pulumi.Output.from_input(program()))()
    return monitor.registrations


@dataclass(frozen=True, kw_only=True)
class StackPreview:
    resources: list[Resource]
    outputs: dict[str, Any]  # what `pulumi stack output` would show


def preview(values: dict[str, Any], stack: str) -> StackPreview:
    """Run the program under mocks with `values` (a stack file's `config:` section) as its config.
    Raises ConfigError for an invalid config."""
    outputs: dict[str, Any] = {}

    def program() -> pulumi.Output:
        root = settings.get_root_resource()
        runpy.run_path(str(PROGRAM))
        return pulumi.Output.from_input(root.outputs).apply(outputs.update)

    project = str(values.get("gcp:project", PLACEHOLDER_PROJECT))
    # The engine hands the program each value as a string, mappings as JSON.
    config = {k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}
    try:
        registrations = record(program, _CloudPlaceholders(project), stack=stack, preview=True, config=config)
    except pulumi.RunError as error:
        raise ConfigError(str(error)) from None
    return StackPreview(resources=_resources(registrations), outputs=outputs)


def _resources(registrations: list[Registration]) -> list[Resource]:
    names = {registration.urn: registration.name for registration in registrations}
    children: dict[str, list[Registration]] = {}
    for registration in registrations:
        children.setdefault(registration.parent_urn if registration.parent_urn in names else "", []).append(registration)

    def walk(parent_urn: str) -> list[Resource]:
        """Each resource followed by its children, siblings by type and name: registration order
        depends on how outputs resolve, this order does not."""
        ordered = []
        for registration in sorted(children.get(parent_urn, []), key=lambda r: (r.type, r.name)):
            ordered.append(
                Resource(
                    type=registration.type,
                    name=registration.name,
                    parent=names.get(parent_urn),
                    inputs=_shown(registration.inputs),
                    provider=names.get(registration.provider_urn),
                    depends_on=tuple(sorted(names[urn] for urn in registration.dependency_urns if urn in names)),
                    urn=registration.urn,
                    dependency_urns=tuple(sorted(urn for urn in registration.dependency_urns if urn in names)),
                    protect=registration.protect,
                    retain_on_delete=registration.retain_on_delete,
                )
            )
            ordered += walk(registration.urn)
        return ordered

    return walk("")


def _shown(value: Any) -> Any:
    """Inputs as plain JSON, keys sorted (the engine's order follows how outputs resolved): unknowns
    become COMPUTED, resource references their URN."""
    if isinstance(value, dict):
        return {key: _shown(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_shown(item) for item in value]
    if isinstance(value, (Unknown, pulumi.Resource)) or value == rpc.UNKNOWN:
        return COMPUTED
    if isinstance(value, float) and value.is_integer():
        return int(value)  # the wire format has only doubles; the provider's schema says integer
    return value


def _documents_decoded(inputs: dict[str, Any]) -> dict[str, Any]:
    """Inputs that are JSON documents as text (a dashboard's `dashboardJson`) shown as the document."""
    decoded = dict(inputs)
    for key, value in inputs.items():
        if isinstance(value, str) and value.startswith("{"):
            try:
                decoded[key] = json.loads(value)
            except json.JSONDecodeError:
                pass
    return decoded


def _print_text(result: StackPreview) -> None:
    for resource in result.resources:
        parent = f"  in {resource.parent}" if resource.parent else ""
        provider = f"  provider {resource.provider}" if resource.provider else ""
        kept = "  protected" * resource.protect + "  kept on destroy" * resource.retain_on_delete
        print(f"{resource.type}  {resource.name}{parent}{provider}{kept}")
        if resource.depends_on:
            print(f"  after: {', '.join(resource.depends_on)}")
        for line in json.dumps(_documents_decoded(resource.inputs), indent=2, sort_keys=True).splitlines()[1:-1]:
            print(f"  {line}")
    print(f"{len(result.resources)} resources. Stack outputs:")
    for line in json.dumps(result.outputs, indent=2, sort_keys=True).splitlines()[1:-1]:
        print(line)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m infra.preview", description=__doc__.splitlines()[0])
    parser.add_argument("--stack", required=True, help="the stack, as in Pulumi.<stack>.yaml (or a path to a stack file)")
    parser.add_argument("--json", action="store_true", help="print a JSON list of {type, name, parent, inputs, dependsOn}")
    try:
        args = parser.parse_args(argv)
        values, stack = offline_values(args.stack, doing="previewing")
        result = preview(values, stack)
    except (ConfigError, UserError) as error:
        print(f"error: {error}", file=sys.stderr)
        return USER_ERROR
    if args.json:
        print(json.dumps([resource.as_dict() for resource in result.resources], indent=2))
    else:
        _print_text(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
