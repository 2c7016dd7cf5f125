"""What becomes of a training run when one of its pods fails, worked out on the rendered objects the
way the Job controller and the JobSet controller decide it, for the events a run meets.

The Job controller (kubernetes pkg/controller/job/pod_failure_policy.go @ 95f08499) tries the
podFailurePolicy rules in order, the first match wins: an exit-code rule looks at the app containers,
then the init containers, skipping those that exited 0 or have not ended; a pod-condition rule needs
a condition of that type and status. FailJob fails the Job with reason PodFailurePolicy and the
message of the matching rule (the formats below); Ignore replaces the pod uncounted; Count (also
when no rule matches) spends one of backoffLimit, past which the Job fails with
BackoffLimitExceeded. JobSet v0.12.0 (pkg/controllers/failure_policy.go) takes the first rule whose
onJobFailureReasons hold the Job's reason and one of whose onJobFailureMessagePatterns (RE2, searched,
not anchored) matches its message, if it has any; no rule matched is RestartJobSet.

`python -m tests.workloads.failure_events` prints the table of docs/workloads.md.
"""

import dataclasses
import re
from typing import Any

from trainer import contract
from workloads import manifests

NOT_COUNTED = "restarts from its last checkpoint, not counted"
COUNTED = "restarts from its last checkpoint, counts against maxRestarts"
FAILS = "fails at once"
_EXIT_MESSAGE = "Container {container} for pod {pod} failed with exit code {code} matching {action} rule at index {index}"
_CONDITION_MESSAGE = "Pod {pod} has condition {condition} matching {action} rule at index {index}"
_BACKOFF_MESSAGE = "Job has reached the specified backoff limit"
_POD = "training/run-abcde"


@dataclasses.dataclass(frozen=True)
class PodFailure:
    event: str
    exit_codes: dict[str, int]  # container -> exit code, of the containers that ended
    disrupted: bool  # the pod carries DisruptionTarget=True
    shows: str  # what `kubectl describe pod` shows, in words
    outcome: str  # what the run must do


EVENTS = (
    PodFailure("preemption by a higher-priority pod", {"trainer": contract.RETRY}, True,
               "DisruptionTarget (PreemptionByScheduler); the trainer checkpointed on SIGTERM, exit 75", NOT_COUNTED),
    PodFailure("Spot VM reclaimed", {"trainer": 128 + 9}, True,
               "DisruptionTarget (TerminationByKubelet, graceful node shutdown); killed after 30 s, exit 137", NOT_COUNTED),
    PodFailure("node maintenance, upgrade or drain", {"trainer": contract.RETRY}, True,
               "DisruptionTarget (EvictionByEvictionAPI); checkpointed on SIGTERM, exit 75", NOT_COUNTED),
    PodFailure("node deleted under the pod", {}, True, "DisruptionTarget (DeletionByPodGC); no exit code", NOT_COUNTED),
    PodFailure("node under disk pressure, or memory pressure from outside the trainer", {"trainer": 128 + 9}, True,
               "DisruptionTarget (TerminationByKubelet, node-pressure eviction): see below", NOT_COUNTED),
    PodFailure("out of memory: the trainer past its limit (the machine's memory for pods, less headroom)",
               {"trainer": 128 + 9}, False, "OOMKilled, exit 137", FAILS),
    PodFailure("a bad flag, config, data file or tokenizer", {"trainer": contract.USER_ERROR}, False,
               "exit 2, one line in the log", FAILS),
    PodFailure("a crash (an exception, a segfault)", {"trainer": 1}, False, "exit 1 (139 for a segfault)", FAILS),
    PodFailure("prepared data never appeared", {"trainer": contract.USER_ERROR}, False,
               "exit 2 after the preparation's deadline, one line naming its Job", FAILS),
    PodFailure("the trainer asks to be restarted", {"trainer": contract.RETRY}, False,
               "exit 75 without a disruption (e.g. kubectl delete pod)", COUNTED),
    PodFailure("SIGTERM before the trainer set its handler", {"trainer": 128 + 15}, False, "exit 143", COUNTED),
)  # fmt: skip


def _slice_job(run: dict[str, Any]) -> dict[str, Any]:
    if run["kind"] == "Job":
        return run["spec"]
    (replicated,) = run["spec"]["replicatedJobs"]
    return replicated["template"]["spec"]


def _pod_failure_action(job: dict[str, Any], failure: PodFailure) -> tuple[str, str]:
    """(action, message) of the first podFailurePolicy rule that matches; ("Count", "") if none."""
    pod = job["template"]["spec"]
    order = [c["name"] for c in pod["containers"]] + [c["name"] for c in pod.get("initContainers", [])]
    ended = [(name, failure.exit_codes[name]) for name in order if failure.exit_codes.get(name, 0) != 0]
    for index, rule in enumerate(job.get("podFailurePolicy", {}).get("rules", [])):
        action = rule["action"]
        if "onExitCodes" in rule:
            requirement = rule["onExitCodes"]
            for name, code in ended:
                if requirement.get("containerName", name) != name:
                    continue
                if (code in requirement["values"]) == (requirement["operator"] == "In"):
                    return action, _EXIT_MESSAGE.format(container=name, pod=_POD, code=code, action=action, index=index)
        for pattern in rule.get("onPodConditions", []):
            if failure.disrupted and pattern["type"] == "DisruptionTarget" and pattern.get("status", "True") == "True":
                return action, _CONDITION_MESSAGE.format(pod=_POD, condition=pattern["type"], action=action, index=index)
    return "Count", ""


def fate(run: dict[str, Any], failure: PodFailure) -> str:
    """NOT_COUNTED, COUNTED or FAILS: what the run (a Job or a JobSet) does after `failure`."""
    job = _slice_job(run)
    action, message = _pod_failure_action(job, failure)
    if action == "Ignore":
        return NOT_COUNTED
    if run["kind"] == "Job":
        if action == "FailJob":
            return FAILS
        return COUNTED if job["backoffLimit"] > 0 else FAILS
    assert job["backoffLimit"] == 0, "a JobSet's Jobs leave restarts to the JobSet"
    reason, message = ("PodFailurePolicy", message) if action == "FailJob" else ("BackoffLimitExceeded", _BACKOFF_MESSAGE)
    policy = run["spec"]["failurePolicy"]
    for rule in policy.get("rules", []):
        reasons, patterns = rule.get("onJobFailureReasons", []), rule.get("onJobFailureMessagePatterns", [])
        if reasons and reason not in reasons or patterns and not any(re.search(p, message) for p in patterns):
            continue
        if rule["action"] == "FailJobSet":
            return FAILS
        if rule["action"] == "RestartJobSetAndIgnoreMaxRestarts":
            return NOT_COUNTED
        break
    return COUNTED if policy["maxRestarts"] > 0 else FAILS


def table(job_run: dict[str, Any], jobset_run: dict[str, Any]) -> str:
    """The docs table: each event, what the pod shows, and what the run does in either shape."""
    lines = ["| event | the pod shows | one host (Job) | multi-host or multislice (JobSet) |", "|---|---|---|---|"]
    for failure in EVENTS:
        lines.append(f"| {failure.event} | {failure.shows} | {fate(job_run, failure)} | {fate(jobset_run, failure)} |")
    return "\n".join(lines) + "\n"


def shipped_table() -> str:
    from tests.workloads.conftest import spec_of, stack_config

    return table(manifests.training(spec_of(stack_config("dev"))), manifests.training(spec_of(stack_config("multislice"))))


if __name__ == "__main__":
    print(shipped_table(), end="")
