"""Admission rules for the serving objects (workloads.serving), registered into tests.workloads.admission.

Like the rules there, each reads one rendered object alone. Sources, at the versions read:
- Kubernetes v1.32: pkg/apis/apps/validation/validation.go (ValidateDeploymentSpec: the selector
  matches the template's labels, the pods restart Always, no rollingUpdate with Recreate),
  pkg/apis/core/validation/validation.go (probes: successThreshold 1 for liveness and start-up,
  a named port is a port name; Service ports), pkg/apis/autoscaling/validation/validation.go
  (minReplicas at least 1 without the HPAScaleToZero alpha gate, maxReplicas at least minReplicas,
  a Pods metric with an AverageValue target).
- The kubelet resolves a probe's named port among the container's ports, or the probe fails.
- GoogleCloudPlatform/prometheus-engine (00f28d4e): charts/operator/crds/monitoring.googleapis.com_
  podmonitorings.yaml, v1: spec.selector and 1-10 spec.endpoints, each with a port and a Prometheus
  duration interval, a timeout no longer than it, scheme http or https, only the fields listed below.
"""

import re
from typing import Any

from tests.workloads.admission import RULES, Obj, _label, rule

# The rules registered here; tests/workloads/test_serving.py breaks each.
SERVING_RULES = ("deployment", "service", "pod-monitoring", "horizontal-pod-autoscaler")
# The pod rules of tests.workloads.admission that read a pod template, whatever holds it.
_POD_RULES = ("names-are-dns-labels", "labels-are-valid", "pod-references", "extended-resources", "non-root-user",
              "gcs-fuse-volumes")  # fmt: skip
_PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
_ENDPOINT_FIELDS = {"authorization", "basicAuth", "interval", "metricRelabeling", "oauth2", "params", "path", "port",
                    "proxyUrl", "scheme", "timeout", "tls"}  # fmt: skip
_POD_MONITORING_FIELDS = {"endpoints", "filterRunning", "limits", "selector", "targetLabels"}
_ENDPOINTS_MAX = 10
# A Prometheus duration (prometheus/common model.ParseDuration).
_DURATION = re.compile(r"^(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?$")
_DURATION_MS = {"y": 365 * 86400000, "w": 7 * 86400000, "d": 86400000, "h": 3600000, "m": 60000, "s": 1000, "ms": 1}


def _deployment_pod_problems(obj: Obj) -> list[str]:
    """The pod rules, on the Deployment's pod template: they read Jobs, so the template is handed
    to them as a Job's, and their lines name the rule and the Deployment."""
    as_job = {"kind": "Job", "metadata": obj["metadata"], "spec": {"template": obj["spec"]["template"]}}
    return [f"{name}: {line.replace(_label(as_job), _label(obj))}" for name in _POD_RULES for line in RULES[name](as_job)]


@rule("deployment")
def _deployment(obj: Obj) -> list[str]:
    if obj.get("kind") != "Deployment":
        return []
    spec, where = obj["spec"], _label(obj)
    pod = spec["template"]
    problems = _deployment_pod_problems(obj)
    labels = pod.get("metadata", {}).get("labels", {})
    selector = spec.get("selector", {}).get("matchLabels", {})
    if not selector or any(labels.get(key) != value for key, value in selector.items()):
        problems.append(f"{where}: selector {selector} does not match the template's labels {labels}")
    if pod["spec"].get("restartPolicy", "Always") != "Always":
        problems.append(f"{where}: a Deployment's pods restart Always, not {pod['spec']['restartPolicy']!r}")
    if spec.get("strategy", {}).get("type") == "Recreate" and "rollingUpdate" in spec["strategy"]:
        problems.append(f"{where}: strategy Recreate may not have rollingUpdate")
    for container in pod["spec"].get("containers", []):
        ports = {port.get("name") for port in container.get("ports", [])}
        for kind in _PROBES:
            probe = container.get(kind)
            if probe is None:
                continue
            if kind != "readinessProbe" and probe.get("successThreshold", 1) != 1:
                problems.append(f"{where}: container {container['name']!r} {kind} successThreshold must be 1")
            port = probe.get("httpGet", {}).get("port")
            if isinstance(port, str) and port not in ports:
                problems.append(f"{where}: container {container['name']!r} {kind} names port {port!r}, which it does not declare")
    return problems


@rule("service")
def _service(obj: Obj) -> list[str]:
    if obj.get("kind") != "Service":
        return []
    ports = obj["spec"].get("ports", [])
    problems = []
    if not ports:
        problems.append(f"{_label(obj)}: a Service needs at least one port")
    if len(ports) > 1 and not all(port.get("name") for port in ports):
        problems.append(f"{_label(obj)}: a Service of several ports must name each")
    for port in ports:
        if not isinstance(port.get("port"), int) or not 0 < port["port"] < 65536:
            problems.append(f"{_label(obj)}: port {port.get('port')!r} is not 1-65535")
        if port.get("protocol", "TCP") not in ("TCP", "UDP", "SCTP"):
            problems.append(f"{_label(obj)}: protocol {port['protocol']!r} is not TCP, UDP or SCTP")
    return problems


def _duration_ms(text: Any) -> int | None:
    match = _DURATION.match(text) if isinstance(text, str) and text else None
    if match is None:
        return None
    return sum(int(value) * _DURATION_MS[unit] for value, unit in re.findall(r"([0-9]+)(ms|[ywdhms])", text))


@rule("pod-monitoring")
def _pod_monitoring(obj: Obj) -> list[str]:
    if obj.get("kind") != "PodMonitoring":
        return []
    where, spec = _label(obj), obj.get("spec", {})
    problems = [f"{where}: spec.{field} is not a PodMonitoring field" for field in sorted(set(spec) - _POD_MONITORING_FIELDS)]
    if obj.get("apiVersion") != "monitoring.googleapis.com/v1":
        problems.append(f"{where}: apiVersion {obj.get('apiVersion')!r} is not monitoring.googleapis.com/v1")
    if "selector" not in spec:
        problems.append(f"{where}: spec.selector is required")
    endpoints = spec.get("endpoints", [])
    if not 0 < len(endpoints) <= _ENDPOINTS_MAX:
        problems.append(f"{where}: spec.endpoints needs 1 to {_ENDPOINTS_MAX} endpoints, has {len(endpoints)}")
    for index, endpoint in enumerate(endpoints):
        at = f"{where}: endpoint {index}"
        problems += [f"{at}: {field} is not an endpoint field" for field in sorted(set(endpoint) - _ENDPOINT_FIELDS)]
        if endpoint.get("port") in (None, "", 0):
            problems.append(f"{at}: port is required")
        interval = _duration_ms(endpoint.get("interval"))
        if interval is None:
            problems.append(f"{at}: interval {endpoint.get('interval')!r} is not a Prometheus duration such as 30s")
        if "timeout" in endpoint and (_duration_ms(endpoint["timeout"]) is None or interval is None
                                      or _duration_ms(endpoint["timeout"]) > interval):  # fmt: skip
            problems.append(f"{at}: timeout {endpoint['timeout']!r} must be a duration no longer than the interval")
        if endpoint.get("scheme", "http") not in ("http", "https"):
            problems.append(f"{at}: scheme {endpoint['scheme']!r} is not http or https")
    return problems


@rule("horizontal-pod-autoscaler")
def _autoscaler(obj: Obj) -> list[str]:
    if obj.get("kind") != "HorizontalPodAutoscaler":
        return []
    where, spec = _label(obj), obj["spec"]
    problems = []
    minimum, maximum = spec.get("minReplicas", 1), spec.get("maxReplicas")
    if minimum < 1:
        problems.append(f"{where}: minReplicas {minimum} needs the HPAScaleToZero alpha feature gate, which GKE does not enable")
    if not isinstance(maximum, int) or maximum < minimum:
        problems.append(f"{where}: maxReplicas {maximum!r} must be at least minReplicas {minimum}")
    target = spec.get("scaleTargetRef", {})
    if not target.get("kind") or not target.get("name"):
        problems.append(f"{where}: scaleTargetRef needs a kind and a name")
    for metric in spec.get("metrics", []):
        if metric.get("type") == "Pods":
            goal = metric.get("pods", {}).get("target", {})
            if goal.get("type") != "AverageValue" or "averageValue" not in goal:
                problems.append(f"{where}: a Pods metric's target must be an AverageValue with averageValue set")
    return problems


def validate_pod_monitoring(obj: Obj) -> None:
    """Stands in for a schema (../shared/schemas has none for monitoring.googleapis.com): raises
    jsonschema.ValidationError for a field the CRD does not have or a value it refuses, and checks
    the metadata as the ObjectMeta of a built-in kind."""
    import jsonschema

    from tests.workloads.schemas import validate_builtin

    problems = _pod_monitoring(obj)
    if problems:
        raise jsonschema.ValidationError("; ".join(problems))
    validate_builtin({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]})
