"""Strict validators: built-in kinds with kubernetes-validate (Kubernetes 1.32), the JobSet with
its CRD's v1alpha2 `openAPIV3Schema` turned into a JSON Schema that rejects unknown fields, and
the Kueue kinds (kueue.x-k8s.io, v1beta2 where the CRDs serve it) the same way, plus the few CEL
and webhook rules of Kueue that a quota or flavor written by hand most easily breaks, and the
references between the Kueue objects (and the runs) that Kueue needs to exist."""

import pathlib
import re
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.workloads.conftest import SCHEMAS_ENV, schemas_dir

KUBERNETES_VERSION = "1.32.0"
JOBSET_VERSION = "v1alpha2"


def validate_builtin(obj: dict[str, Any]) -> None:
    """Raises jsonschema.ValidationError for an unknown field or a wrong type."""
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def strict_schema(node: Any) -> Any:
    """A structural CRD schema as JSON Schema, as strict as the API server's field validation:
    an object with `properties` admits no others; int-or-string and nullable spelled out."""
    if not isinstance(node, dict):
        return node
    schema = {k: v for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if "properties" in schema:
        schema["properties"] = {name: strict_schema(sub) for name, sub in schema["properties"].items()}
        if "additionalProperties" not in schema and not node.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            schema[key] = strict_schema(schema[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            schema[key] = [strict_schema(sub) for sub in schema[key]]
    if node.get("x-kubernetes-int-or-string"):
        schema.pop("type", None)
        schema.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("nullable") and "type" in schema:
        schema["type"] = [schema["type"], "null"]
    return schema


def jobset_crd_path() -> pathlib.Path:
    path = schemas_dir() / "jobset-crd.yaml"
    if not path.is_file():
        pytest.skip(
            f"{path} not found: set {SCHEMAS_ENV} to a folder holding jobset-crd.yaml, the JobSet CRD "
            "(config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml of kubernetes-sigs/jobset, "
            "also in each release's manifests.yaml)"
        )
    return path


def jobset_validator() -> jsonschema.Draft7Validator:
    crd = yaml.safe_load(jobset_crd_path().read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == JOBSET_VERSION]
    return jsonschema.Draft7Validator(strict_schema(version["schema"]["openAPIV3Schema"]))


def validate_jobset(obj: dict[str, Any], validator: jsonschema.Draft7Validator) -> None:
    """The CRD leaves `metadata` open; it is checked as the ObjectMeta of a built-in kind."""
    validator.validate(obj)
    validate_builtin({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]})


CHECKPOINT_CONFIGURATION_CRD = "checkpointing.gke.io_checkpointconfigurations.yaml"
# A Kubernetes quantity (apimachinery resource.ParseQuantity), which GKE's controller parses inMemoryVolumeSize as.
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")


def checkpoint_configuration_validator() -> tuple[str, jsonschema.Draft7Validator]:
    """(apiVersion, validator of the rest) from the open-source CRD of GKE's HighScaleCheckpointing backend
    (GoogleCloudPlatform/high-scale-checkpointing-controller crd/checkpointconfiguration.yaml); the copy a
    GKE cluster installs may differ (../shared/schemas/SOURCES.md)."""
    path = schemas_dir() / CHECKPOINT_CONFIGURATION_CRD
    if not path.is_file():
        pytest.skip(f"{path} not found: set {SCHEMAS_ENV} to a folder holding {CHECKPOINT_CONFIGURATION_CRD}, the CRD "
                    "crd/checkpointconfiguration.yaml of GoogleCloudPlatform/high-scale-checkpointing-controller (on a cluster "
                    "with the addon: kubectl get crd checkpointconfigurations.checkpointing.gke.io -o yaml)")
    crd = yaml.safe_load(path.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("served")]
    return f"{crd['spec']['group']}/{version['name']}", jsonschema.Draft7Validator(strict_schema(version["schema"]["openAPIV3Schema"]))


def checkpoint_configuration_errors(obj: dict[str, Any], api_version: str, validator: jsonschema.Draft7Validator) -> list[str]:
    """What the API server (the CRD's schema, its cluster scope) and GKE's controller (a bare bucket name,
    a quantity) would refuse. The schema leaves out apiVersion, kind and metadata, which every object has."""
    errors = [error.message for error in validator.iter_errors({k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")})]
    spec = obj.get("spec") or {}
    if obj.get("apiVersion") != api_version or obj.get("kind") != "CheckpointConfiguration":
        errors.append(f"{obj.get('apiVersion')} {obj.get('kind')} is not {api_version} CheckpointConfiguration")
    if "namespace" in obj.get("metadata", {}):
        errors.append("metadata.namespace: the kind is cluster-scoped")
    if not spec.get("cloudStorageBucketName") or "/" in str(spec.get("cloudStorageBucketName")):
        errors.append("spec.cloudStorageBucketName: the bare bucket name is required (not gs://...)")
    if not _QUANTITY.match(str(spec.get("inMemoryVolumeSize", ""))):
        errors.append(f"spec.inMemoryVolumeSize: {spec.get('inMemoryVolumeSize')!r} is not a quantity such as 64Gi")
    return errors


KUEUE_RELEASE = "v0.19.2"
KUEUE_GROUP = "kueue.x-k8s.io"
# The storage version of every Kueue CRD since v0.15; v1beta1 is still served there, deprecated.
KUEUE_VERSIONS = ("v1beta2", "v1beta1")
KUEUE_CRD_FILES = (
    "resourceflavors", "clusterqueues", "localqueues", "workloadpriorityclasses", "admissionchecks",
    "provisioningrequestconfigs", "workloads", "topologies", "cohorts",
)
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def kueue_crds_path() -> pathlib.Path:
    path = schemas_dir() / "kueue-crds.yaml"
    if not path.is_file():
        files = ", ".join(f"kueue.x-k8s.io_{name}.yaml" for name in KUEUE_CRD_FILES)
        pytest.skip(
            f"{path} not found: set {SCHEMAS_ENV} to a folder holding kueue-crds.yaml (or put it in "
            f"../shared/schemas beside the repository), the Kueue {KUEUE_RELEASE} CRDs as one "
            f"multi-document YAML: {files} of config/components/crd/bases/ in kubernetes-sigs/kueue "
            f"at tag {KUEUE_RELEASE}, concatenated with `---` between them (the CRDs of the release's "
            "manifests.yaml will do too)"
        )
    return path


def _python_patterns(node: Any) -> Any:
    """Go's RE2 takes a flag group anywhere (`^(?i)[a-z]...`); Python's re wants it first."""
    if isinstance(node, dict):
        return {
            k: re.sub(r"^\^\(\?([a-z]+)\)", r"(?\1)^", v) if k == "pattern" and isinstance(v, str) else _python_patterns(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_python_patterns(v) for v in node]
    return node


def kueue_validators() -> dict[str, jsonschema.Draft7Validator]:
    """{kind: validator} for every kueue.x-k8s.io kind in kueue-crds.yaml, from the first served
    version of KUEUE_VERSIONS. Each schema also pins apiVersion and kind, requires metadata with a
    DNS-subdomain name (as the API server does for custom resources) and, for a cluster-scoped
    kind, refuses metadata.namespace (stricter than the API server, which drops it)."""
    validators = {}
    for crd in yaml.safe_load_all(kueue_crds_path().read_text()):
        if not crd or crd["spec"]["group"] != KUEUE_GROUP:
            continue
        served = {v["name"]: v for v in crd["spec"]["versions"] if v.get("served")}
        version = next((served[name] for name in KUEUE_VERSIONS if name in served), None)
        if version is None:
            continue
        kind = crd["spec"]["names"]["kind"]
        schema = _python_patterns(strict_schema(version["schema"]["openAPIV3Schema"]))
        metadata: dict[str, Any] = {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string", "maxLength": 253, "pattern": DNS_SUBDOMAIN}},
        }
        if crd["spec"]["scope"] == "Cluster":
            metadata["not"] = {"required": ["namespace"]}
        schema["properties"] |= {
            "apiVersion": {"const": f"{KUEUE_GROUP}/{version['name']}"},
            "kind": {"const": kind},
            "metadata": metadata,
        }
        schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
        validators[kind] = jsonschema.Draft7Validator(schema)
    return validators


def _quantity_is_negative(value: Any) -> bool:
    return str(value).strip().startswith("-")


def kueue_rule_errors(obj: dict[str, Any]) -> list[str]:
    """The CEL rules of the CRDs and the checks of pkg/webhooks (Kueue v0.19.2) that the schema
    above cannot express, for a ClusterQueue and a ResourceFlavor."""
    spec = obj.get("spec") or {}
    errors = []
    if obj["kind"] == "ClusterQueue":
        seen_resources: set[str] = set()
        seen_flavors: set[str] = set()
        has_cohort = bool(spec.get("cohortName"))
        for i, group in enumerate(spec.get("resourceGroups", [])):
            covered = group["coveredResources"]
            for name in covered:
                if name in seen_resources:
                    errors.append(f"resourceGroups[{i}].coveredResources: {name} is in another resource group")
                seen_resources.add(name)
            for flavor in group["flavors"]:
                where = f"resourceGroups[{i}].flavors[{flavor['name']}]"
                if flavor["name"] in seen_flavors:
                    errors.append(f"{where}: the flavor is in another resource group")
                seen_flavors.add(flavor["name"])
                names = [r["name"] for r in flavor["resources"]]
                if names != covered:
                    errors.append(f"{where}.resources: names {names} must be coveredResources {covered}, in order")
                for r in flavor["resources"]:
                    for key in ("nominalQuota", "borrowingLimit", "lendingLimit"):
                        if key in r and _quantity_is_negative(r[key]):
                            errors.append(f"{where}.resources[{r['name']}].{key}: must be non-negative")
                    if not has_cohort and ("borrowingLimit" in r or "lendingLimit" in r):
                        errors.append(f"{where}.resources[{r['name']}]: borrowingLimit/lendingLimit need cohortName")
        flavors = {f["name"] for g in spec.get("resourceGroups", []) for f in g["flavors"]}
        for check in (spec.get("admissionChecksStrategy") or {}).get("admissionChecks", []):
            for flavor in check.get("onFlavors", []):
                if flavor not in flavors:
                    errors.append(f"admissionChecksStrategy: {check['name']} onFlavors {flavor} is no flavor of the queue")
        preemption = spec.get("preemption") or {}
        if preemption.get("reclaimWithinCohort", "Never") == "Never" and (
            preemption.get("borrowWithinCohort") or {}
        ).get("policy", "Never") != "Never":
            errors.append("preemption: reclaimWithinCohort=Never and borrowWithinCohort.Policy!=Never")
    if obj["kind"] == "ClusterQueue":
        errors += _label_problems("spec.namespaceSelector.matchLabels", (spec.get("namespaceSelector") or {}).get("matchLabels", {}))
    if obj["kind"] == "ResourceFlavor":
        # pkg/webhooks/resourceflavor_webhook.go: ValidateLabels on nodeLabels, validateTolerations.
        errors += _label_problems("spec.nodeLabels", spec.get("nodeLabels", {}))
        for t in spec.get("tolerations", []):
            if "key" in t and not _QUALIFIED_NAME.match(t["key"]):
                errors.append(f"spec.tolerations: key {t['key']!r} is not a qualified name")
            if "value" in t and not _LABEL_VALUE.match(t["value"]):
                errors.append(f"spec.tolerations: value {t['value']!r} is not a label value")
        if "topologyName" in spec and not spec.get("nodeLabels"):
            errors.append("spec: at least one nodeLabel is required when topology is set")
        taints = [(t["key"], t["effect"]) for t in spec.get("nodeTaints", [])]
        if len(taints) != len(set(taints)):
            errors.append("spec.nodeTaints: taints must be unique by key and effect pair")
        for t in spec.get("tolerations", []):
            if "key" not in t and t.get("operator") != "Exists":
                errors.append("spec.tolerations: operator must be Exists when 'key' is empty")
            if t.get("operator") == "Exists" and "value" in t:
                errors.append("spec.tolerations: a value must be empty when 'operator' is 'Exists'")
            if "tolerationSeconds" in t and t.get("effect") != "NoExecute":
                errors.append("spec.tolerations: effect must be 'NoExecute' when 'tolerationSeconds' is set")
    return errors


# apimachinery validation.go: IsQualifiedName (label keys, toleration keys), IsValidLabelValue.
_QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


def _label_problems(where: str, labels: dict[str, str]) -> list[str]:
    return [f"{where}: {key}={value!r} is not a label (qualified name = label value)"
            for key, value in labels.items() if not _QUALIFIED_NAME.match(key) or not _LABEL_VALUE.match(value)]  # fmt: skip


def kueue_reference_errors(objects: list[dict[str, Any]]) -> list[str]:
    """What makes Kueue leave a queue inactive or a run unqueued, across the objects applied
    together (kueue v0.19.2): a ClusterQueue whose flavors or admission checks do not exist is
    inactive (pkg/cache/scheduler/clusterqueue.go inactiveReason: FlavorNotFound,
    AdmissionCheckNotFound); a provisioning AdmissionCheck whose parameters are not a
    kueue.x-k8s.io ProvisioningRequestConfig that exists is inactive (pkg/util/admissioncheck
    refValidForGK, "BadParametersRef"); a LocalQueue of a missing ClusterQueue admits nothing
    (localqueue_controller.go "ClusterQueueDoesNotExist"), nor one whose ClusterQueue's
    namespaceSelector leaves out its namespace; a Job or JobSet names a LocalQueue of its own
    namespace and a WorkloadPriorityClass that exist (jobframework: no Workload otherwise)."""
    by_kind: dict[str, dict[tuple[str | None, str], dict[str, Any]]] = {}
    for obj in objects:
        metadata = obj["metadata"]
        by_kind.setdefault(obj["kind"], {})[(metadata.get("namespace"), metadata["name"])] = obj

    def exists(kind: str, name: str, namespace: str | None = None) -> bool:
        return (namespace, name) in by_kind.get(kind, {})

    errors = []
    for (_, name), cq in by_kind.get("ClusterQueue", {}).items():
        spec = cq["spec"]
        errors += [f"ClusterQueue {name}: ResourceFlavor {f['name']} does not exist"
                   for group in spec.get("resourceGroups", []) for f in group["flavors"] if not exists("ResourceFlavor", f["name"])]  # fmt: skip
        errors += [f"ClusterQueue {name}: AdmissionCheck {check['name']} does not exist"
                   for check in (spec.get("admissionChecksStrategy") or {}).get("admissionChecks", [])
                   if not exists("AdmissionCheck", check["name"])]  # fmt: skip
    for (_, name), check in by_kind.get("AdmissionCheck", {}).items():
        parameters = check["spec"].get("parameters") or {}
        if check["spec"]["controllerName"] == "kueue.x-k8s.io/provisioning-request" and not (
            parameters.get("apiGroup") == "kueue.x-k8s.io" and parameters.get("kind") == "ProvisioningRequestConfig"
            and exists("ProvisioningRequestConfig", parameters.get("name", ""))
        ):
            errors.append(f"AdmissionCheck {name}: parameters {parameters} are no ProvisioningRequestConfig of the stack")
    for (namespace, name), queue in by_kind.get("LocalQueue", {}).items():
        cq = by_kind.get("ClusterQueue", {}).get((None, queue["spec"]["clusterQueue"]))
        if cq is None:
            errors.append(f"LocalQueue {namespace}/{name}: ClusterQueue {queue['spec']['clusterQueue']} does not exist")
            continue
        selector = (cq["spec"].get("namespaceSelector") or {}).get("matchLabels", {})
        if selector and selector != {"kubernetes.io/metadata.name": namespace}:
            errors.append(f"LocalQueue {namespace}/{name}: ClusterQueue {cq['metadata']['name']} does not select its namespace")
    for kind in ("Job", "JobSet"):
        for (namespace, name), job in by_kind.get(kind, {}).items():
            labels = job["metadata"].get("labels", {})
            queue, priority = labels.get("kueue.x-k8s.io/queue-name"), labels.get("kueue.x-k8s.io/priority-class")
            if queue is not None and not exists("LocalQueue", queue, namespace):
                errors.append(f"{kind} {namespace}/{name}: LocalQueue {queue} does not exist in its namespace")
            if priority is not None and not exists("WorkloadPriorityClass", priority):
                errors.append(f"{kind} {namespace}/{name}: WorkloadPriorityClass {priority} does not exist")
    return errors


def validate_kueue(obj: dict[str, Any], validators: dict[str, jsonschema.Draft7Validator]) -> None:
    """Raises jsonschema.ValidationError for a kind or apiVersion the CRDs do not serve, an
    unknown field or a wrong type anywhere, a broken Kueue rule (see kueue_rule_errors), or
    metadata that is no ObjectMeta."""
    kind = obj.get("kind")
    if kind not in validators:
        raise jsonschema.ValidationError(f"kind {kind!r} is no Kueue kind of kueue-crds.yaml ({sorted(validators)})")
    validators[kind].validate(obj)
    errors = kueue_rule_errors(obj)
    if errors:
        raise jsonschema.ValidationError(f"{kind} {obj['metadata']['name']}: " + "; ".join(errors))
    validate_builtin({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]})
