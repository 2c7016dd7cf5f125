"""The trainer image: built from `trainer/` and pushed to the stack's registry, or a configured URI.

The tag is a hash of the build context (minus what `trainer/.dockerignore` leaves out), so an
unchanged tree keeps its tag and is not rebuilt, while any change to the sources, the Dockerfile or
the pinned requirements gets a new tag and, through the image digest, a new training run.
"""

import fnmatch
import hashlib
from pathlib import Path

import pulumi
import pulumi_docker_build as docker_build
import pulumi_gcp as gcp

from infra.config import StackConfig
from trainer.contract import TRAINER_UID

TRAINER_DIR = Path(__file__).resolve().parents[2] / "trainer"
IMAGE_NAME = "trainer"
# Artifact Registry accepts a short-lived OAuth access token as the password of this fixed user.
_REGISTRY_USER = "oauth2accesstoken"


def _ignore_patterns(context: Path) -> list[str]:
    ignore_file = context / ".dockerignore"
    if not ignore_file.exists():
        return []
    lines = (line.strip() for line in ignore_file.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _ignored(relative: str, patterns: list[str]) -> bool:
    # `**/x` in a .dockerignore matches x at any depth, as does a plain `x` at the top.
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        bare = pattern.removeprefix("**/")
        if any(fnmatch.fnmatch(p, pattern) for p in prefixes):
            return True
        if bare != pattern and any(fnmatch.fnmatch(part, bare) for part in parts):
            return True
    return False


def source_tag(context: Path = TRAINER_DIR) -> str:
    """A hash of every file Docker would send from `context`: the same tree gives the same tag."""
    patterns = _ignore_patterns(context)
    digest = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        relative = path.relative_to(context).as_posix()
        if _ignored(relative, patterns):
            continue
        digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


class TrainerImage(pulumi.ComponentResource):
    """The image the training pods run. `ref` is the configured `gemma-tpu:image`, or the pushed
    build's digest-pinned reference (`<repository>/trainer:<source tag>@sha256:...`)."""

    ref: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        *,
        config: StackConfig,
        repository_url: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gemma-tpu:infra:TrainerImage", name, None, opts)
        if config.image:
            self.ref = pulumi.Output.from_input(config.image)
        else:
            self.ref = self._build(name, pulumi.Output.from_input(repository_url)).ref
        self.register_outputs({"ref": self.ref})

    def _build(self, name: str, repository_url: pulumi.Output[str]) -> docker_build.Image:
        client = gcp.organizations.get_client_config_output(opts=pulumi.InvokeOutputOptions(parent=self))
        return docker_build.Image(
            name,
            context=docker_build.BuildContextArgs(location=str(TRAINER_DIR)),
            dockerfile=docker_build.DockerfileArgs(location=str(TRAINER_DIR / "Dockerfile")),
            build_args={"TRAINER_UID": str(TRAINER_UID)},
            platforms=[docker_build.Platform.LINUX_AMD64],
            push=True,
            # `pulumi preview` stays fast and needs no Docker; the digest is known after `up`.
            build_on_preview=False,
            tags=[pulumi.Output.concat(repository_url, f"/{IMAGE_NAME}:{source_tag()}")],
            registries=[
                docker_build.RegistryArgs(
                    address=repository_url.apply(lambda url: url.split("/", 1)[0]),
                    username=_REGISTRY_USER,
                    password=pulumi.Output.secret(client.access_token),
                )
            ],
            opts=pulumi.ResourceOptions(parent=self),
        )
