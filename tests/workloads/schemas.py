"""Strict validators: built-in kinds with kubernetes-validate (Kubernetes 1.32), the JobSet with
its CRD's v1alpha2 `openAPIV3Schema` turned into a JSON Schema that rejects unknown fields."""

import pathlib
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
