"""The Kubernetes objects a Pulumi resource applies, and the pod specs inside them.

Covers typed resources (`kubernetes:batch/v1:Job`), custom resources (`kubernetes:<group/version>:<Kind>`,
e.g. a JobSet through apiextensions.CustomResource) and inline manifests of `kubernetes:yaml/...`
resources (ConfigGroup `objs` / `yaml`). Manifests read from files or URLs are not visible to a
resource policy here; in a real preview their objects are registered, and checked, one by one.
"""

from collections.abc import Mapping
from typing import Any, NamedTuple

import yaml

from rules.base import as_list, dig, is_mapping

_MANIFEST_MODULE_PREFIX = "yaml"  # kubernetes:yaml:ConfigGroup, kubernetes:yaml/v2:ConfigGroup


class KubeObject(NamedTuple):
    kind: str
    body: Mapping[str, Any]  # metadata, spec, ... as applied

    @property
    def label(self) -> str:
        return f"{self.kind} {dig(self.body, 'metadata', 'name') or '(unnamed)'}"

    def annotation(self, key: str) -> Any:
        return dig(self.body, "metadata", "annotations", key)


def _manifest_objects(props: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    documents = as_list(props.get("objs"))
    text = props.get("yaml")
    for manifest in [text] if isinstance(text, str) else as_list(text):
        try:
            documents += list(yaml.safe_load_all(manifest))
        except yaml.YAMLError:
            continue  # the provider rejects it before anything is applied
    objects = []
    for doc in documents:
        if is_mapping(doc) and doc.get("kind") == "List":
            objects += [item for item in as_list(doc.get("items")) if is_mapping(item)]
        elif is_mapping(doc):
            objects.append(doc)
    return objects


def kubernetes_objects(resource_type: str, props: Mapping[str, Any]) -> list[KubeObject]:
    parts = resource_type.split(":")
    if len(parts) != 3 or parts[0] != "kubernetes" or parts[1].startswith("helm.sh"):
        return []  # not Kubernetes, or a Helm chart (its objects are not in its inputs)
    module, kind = parts[1], parts[2]
    if module.split("/")[0] == _MANIFEST_MODULE_PREFIX:
        return [KubeObject(str(obj.get("kind", "")), obj) for obj in _manifest_objects(props)]
    if kind.endswith("Patch") or kind.endswith("List"):
        return []  # patches and lists of live objects create no pods of their own
    return [KubeObject(kind, props)]


def pod_specs(obj: KubeObject) -> list[Mapping[str, Any]]:
    """The pod specs an object creates: a Pod's own, a Job's template, each JobSet replicated job's."""
    spec = obj.body.get("spec")
    if obj.kind == "Pod":
        candidates = [spec]
    elif obj.kind == "CronJob":
        candidates = [dig(spec, "jobTemplate", "spec", "template", "spec")]
    elif obj.kind == "JobSet":
        candidates = [dig(rj, "template", "spec", "template", "spec") for rj in as_list(dig(spec, "replicatedJobs"))]
    else:  # Job, Deployment, StatefulSet, DaemonSet, ReplicaSet
        candidates = [dig(spec, "template", "spec")]
    return [c for c in candidates if is_mapping(c)]


def containers(pod_spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every container that runs in the pod, init and ephemeral ones included."""
    return [
        c
        for field in ("initContainers", "containers", "ephemeralContainers")
        for c in as_list(pod_spec.get(field))
        if is_mapping(c)
    ]
