"""Names the stack gives its node pools and training objects, and the length rule they must meet.

The lowest layer: config checks a run name here before anything is declared, and the node pools and
workload builders take their names from here, so the names checked are the names generated.

Kubernetes and the JobSet webhook derive more names from a training object's name and refuse the
object when one of them is not a DNS label (at most 63 characters):
- batch/v1 Job: its name is the value of the `batch.kubernetes.io/job-name` label on its pods;
- JobSet (kubernetes-sigs/jobset pkg/webhooks/jobset_webhook.go, ValidateCreate): the longest Job
  `<jobset>-<replicatedJob>-<replicas-1>` and pod `<jobset>-<replicatedJob>-<job>-<pod>-abcde`
  (5 random characters), and with `spec.coordinator` the coordinator's address
  `<jobset>-<replicatedJob>-<job>-<pod>.<subdomain>`, a label value (the subdomain defaults to the
  JobSet's name).
"""

DNS_LABEL_MAX = 63
RUN_HASH_CHARS = 8  # the run name is `<runName>-<hash>`, see workloads.spec.run_spec
SLICE_JOB = "slice"  # the JobSet's replicated job: one Job per slice
CPU_POOL_NAME = "cpu"  # controllers (JobSet) and CPU jobs (data preparation)
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"  # the label GKE gives a node: its pool's name
TRAINER_CONTAINER = "trainer"  # the training pods' container that runs the trainer
_RANDOM_POD_SUFFIX = "-abcde"  # what Kubernetes appends to a Job's pod names, as the webhook counts it


def tpu_pool_names(slices: int) -> tuple[str, ...]:
    """The node pool of each slice, in slice order; multislice workloads place one slice's Job per pool."""
    return tuple(f"tpu-slice-{index}" for index in range(slices))


def run_object_name(run_name: str, digest: str) -> str:
    """The training Job's / JobSet's name: the user's run name and a digest of what the run depends on."""
    return f"{run_name}-{digest[:RUN_HASH_CHARS]}"


def run_kind(*, slices: int, hosts_per_slice: int) -> str:
    """The training object's kind: a batch/v1 Job for one host, a JobSet as soon as there are several."""
    return "Job" if slices * hosts_per_slice == 1 else "JobSet"


def generated_names(run_name: str, *, slices: int, hosts_per_slice: int) -> dict[str, str]:
    """The longest name of each kind that the training object of `run_name` leads to, keyed by what
    the admission path calls it (x: the run's hash). One host is a batch/v1 Job; several are a
    JobSet of `slices` Jobs, with a coordinator when there are several slices."""
    run_object = run_object_name(run_name, "x" * RUN_HASH_CHARS)
    if run_kind(slices=slices, hosts_per_slice=hosts_per_slice) == "Job":
        return {"Job name (the job-name label of its pod)": run_object}
    last_job = f"{run_object}-{SLICE_JOB}-{slices - 1}"
    names = {
        "JobSet name": run_object,
        "name of its last Job": last_job,
        "name of its last pod": f"{last_job}-{hosts_per_slice - 1}{_RANDOM_POD_SUFFIX}",
    }
    if slices > 1:
        names["coordinator address (a label value)"] = f"{run_object}-{SLICE_JOB}-0-0.{run_object}"
    return names


def too_long(names: dict[str, str]) -> dict[str, str]:
    """The names that are longer than a DNS label."""
    return {what: name for what, name in names.items() if len(name) > DNS_LABEL_MAX}


def run_name_max(*, slices: int, hosts_per_slice: int) -> int:
    """The longest run name all of whose generated names are DNS labels."""
    return max(
        length
        for length in range(1, DNS_LABEL_MAX + 1)
        if not too_long(generated_names("a" * length, slices=slices, hosts_per_slice=hosts_per_slice))
    )
