"""Every bad stack input tried, and the one line a user gets for it from `python -m infra.preview`
(and from `pulumi up`, which prints the same message). These cases are the rows of docs/bad-inputs.md
"Stack config": `python -m tests.infra.bad_stack_inputs` prints that table, and a test checks that
the document shows it."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

PROJECT_ID = "acme-ml-123"
STACK = "team-a"
FILE = "{file}"  # in an expected error: the stack file's path as given to --stack


@dataclass(frozen=True, kw_only=True)
class BadStack:
    case: str
    error: str  # what follows "error: " on stderr
    config: dict[str, Any] | None = None  # entries of `config:` besides gcp:project
    file: bytes | None = None  # or a whole stack file, for problems with the file itself
    described: str = ""  # how the doc shows `file`
    stack: str = STACK
    exists: bool = True  # False: --stack names a file that is not there

    def file_bytes(self) -> bytes:
        if self.file is not None:
            return self.file
        values = {"gcp:project": PROJECT_ID, **self.config}
        return ("config:\n" + "".join(f"  {_entry(key, value)}\n" for key, value in values.items())).encode()

    def write(self, folder: Path) -> Path:
        path = folder / f"Pulumi.{self.stack}.yaml"
        if self.exists:
            path.write_bytes(self.file_bytes())
        return path

    def expected(self, path: Path) -> str:
        return self.error.replace(FILE, str(path))

    def table_row(self) -> str:
        given = self.described or " ".join(f"`{_entry(key, value)}`" for key, value in self.config.items())
        if self.stack != STACK and not self.described:
            given = f"the file `Pulumi.{self.stack}.yaml` {given}".strip()
        error = self.error.replace(FILE, f"Pulumi.{self.stack}.yaml")
        # A double-backtick span may hold the single backticks of a message.
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in (self.case, given, f"`` error: {error} ``")) + " |"


def _entry(key: str, value: Any) -> str:
    """One `config:` entry as a user writes it: `gemma-tpu:tpu: {topology: 3x3}`."""
    return f"{key}: {yaml.safe_dump([value], default_flow_style=True, width=1000).strip()[1:-1]}"


KEYS = (
    "gcp:project, gcp:region, gcp:zone, gemma-tpu:cluster, gemma-tpu:tpu, gemma-tpu:storage, gemma-tpu:image, "
    "gemma-tpu:namespace, gemma-tpu:serviceAccount, gemma-tpu:protect, gemma-tpu:trainerRunsAsRoot, gemma-tpu:training, "
    "gemma-tpu:runs, gemma-tpu:queue, gemma-tpu:monitoring, gemma-tpu:serving, gemma-tpu:network"
)
MULTISLICE = {"topology": "2x4", "slices": 2}
QUEUED = {"enabled": True}
MULTI_TIER = {"backupMinutes": 30}
LOCAL_TIER = {"localCheckpointInterval": "auto"}
SERVING = {"enabled": True, "image": "vllm/vllm-tpu:v0.27.0@sha256:" + "a" * 64}

CASES = (
    # The file itself
    BadStack(case="no such stack", stack="staging", exists=False, described="`--stack Pulumi.staging.yaml`, no such file",
             error="no stack file {file}; the stacks here are autopilot, dev, multihost, multislice, queued, serving"),
    BadStack(case="not UTF-8 text", file=b"\x00\x01\xff\xfe", described="binary bytes",
             error="{file} is not UTF-8 text; save the stack file as UTF-8 YAML"),
    BadStack(case="broken YAML", file=b"config:\n  gemma-tpu:tpu: {slices: 2\n", described="`gemma-tpu:tpu: {slices: 2` (unclosed)",
             error="{file} is not valid YAML: line 3: expected ',' or '}', but got '<stream end>'; correct that line"),
    BadStack(case="a key set twice", file=b"config:\n  gcp:project: acme-ml-123\n  gcp:project: acme-ml-456\n",
             described="`gcp:project` on two lines",
             error="{file} is not valid YAML: line 3: 'gcp:project' is set twice; correct that line"),
    BadStack(case="file is a list", file=b"- gcp:project: acme-ml-123\n", described="`- gcp:project: acme-ml-123`",
             error="{file} must be a mapping with a `config:` section"),
    BadStack(case="config is a list", file=b"config:\n  - gcp:project: acme-ml-123\n", described="`config:` holding a list",
             error="the `config:` section of {file} must be a mapping of keys to values, got [{'gcp:project': 'acme-ml-123'}]"),
    BadStack(case="encrypted value", file=b"config:\n  gcp:project:\n    secure: v1:AAAA\n",
             described="`gcp:project: {secure: v1:AAAA}` (set with --secret)",
             error="gcp:project is encrypted in {file}, and no key of this project is a secret: "
             "set it in plain text with `pulumi config set 'gcp:project' VALUE`"),
    BadStack(case="stack name too long", stack="a-very-long-stack-name", config={},
             error="the stack name 'a-very-long-stack-name' must be at most 18 characters of a-z, 0-9 and '-', starting with a letter"),
    BadStack(case="stack name with capitals", stack="TeamA", config={},
             error="the stack name 'TeamA' must be at most 18 characters of a-z, 0-9 and '-', starting with a letter"),
    # Keys
    BadStack(case="unknown top-level key", config={"gemma-tpu:tpus": {"slices": 2}},
             error=f"gemma-tpu:tpus is not a known key (did you mean gemma-tpu:tpu?); the keys here are {KEYS}"),
    BadStack(case="key without its namespace", config={"tpu": {"topology": "2x4"}},
             error=f"tpu is not a known key (did you mean gemma-tpu:tpu?); the keys here are {KEYS}"),
    BadStack(case="key that is a number", config={1: "x"}, error=f"1 is not a known key; the keys here are {KEYS}"),
    BadStack(case="misspelt nested key", config={"gemma-tpu:tpu": {"topolgy": "2x4"}},
             error="gemma-tpu:tpu.topolgy is not a known key (did you mean topology?); the keys here are accelerator, "
             "topology, slices, capacity, reservation"),
    BadStack(case="nested key set without --path", config={"gemma-tpu:tpu.slices": 2},
             error="gemma-tpu:tpu.slices is not a known key; to set a key inside gemma-tpu:tpu, run "
             "`pulumi config set --path 'gemma-tpu:tpu.slices' VALUE`"),
    BadStack(case="the old deletion protection key", config={"gemma-tpu:cluster": {"deletionProtection": True}},
             error="gemma-tpu:cluster.deletionProtection is now gemma-tpu:protect; set that key instead and remove this one"),
    BadStack(case="section that is not a mapping", config={"gemma-tpu:tpu": "v6e-8"},
             error="gemma-tpu:tpu must be a mapping of keys to values, got 'v6e-8'"),
    # Values
    BadStack(case="missing project", config={"gcp:project": ""},
             error="gcp:project is required: run `pulumi config set gcp:project YOUR_PROJECT_ID`"),
    BadStack(case="project that is not a project ID", config={"gcp:project": "My_Project"},
             error="gcp:project 'My_Project' is not a Google Cloud project ID (6-30 of a-z, 0-9, -)"),
    BadStack(case="region that is not a region", config={"gcp:region": "east"},
             error="gcp:region 'east' is not a region name such as us-east5"),
    BadStack(case="zone outside the region", config={"gcp:region": "us-east5", "gcp:zone": "us-central1-a"},
             error="gcp:zone 'us-central1-a' is not in gcp:region 'us-east5'; use a zone such as us-east5-b"),
    BadStack(case="unknown cluster mode", config={"gemma-tpu:cluster": {"mode": "gke"}},
             error="gemma-tpu:cluster.mode is 'gke'; choose one of standard, autopilot"),
    BadStack(case="unknown accelerator", config={"gemma-tpu:tpu": {"accelerator": "v4"}},
             error="gemma-tpu:tpu.accelerator is 'v4'; choose one of v6e, v5e, v5p"),
    BadStack(case="unknown topology", config={"gemma-tpu:tpu": {"topology": "3x3"}},
             error="gemma-tpu:tpu.topology: topology '3x3' is not a v6e slice; choose one of 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16"),
    BadStack(case="topology of another accelerator", config={"gemma-tpu:tpu": {"accelerator": "v5p", "topology": "2x4"}},
             error="gemma-tpu:tpu.topology: topology '2x4' is not a v5p slice; choose one of 2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4"),
    BadStack(case="multislice of single-host slices", config={"gemma-tpu:tpu": {"topology": "2x2", "slices": 2}},
             error="gemma-tpu:tpu.slices is 2 but v6e 2x2 is a single-host slice; multislice needs a multi-host topology "
             "(2x4, 4x4, 4x8, 8x8, 8x16, 16x16) or slices: 1"),
    BadStack(case="text for a number of slices", config={"gemma-tpu:tpu": {"slices": "2"}},
             error="gemma-tpu:tpu.slices must be an integer, got '2'"),
    BadStack(case="true for a number of slices", config={"gemma-tpu:tpu": {"slices": True}},
             error="gemma-tpu:tpu.slices must be an integer, got True"),
    BadStack(case="fraction for a number of slices", config={"gemma-tpu:tpu": {"slices": 1.5}},
             error="gemma-tpu:tpu.slices must be an integer, got 1.5"),
    BadStack(case="zero slices", config={"gemma-tpu:tpu": {"slices": 0}},
             error="gemma-tpu:tpu.slices is 0; it must be at least 1"),
    BadStack(case="unknown capacity", config={"gemma-tpu:tpu": {"capacity": "preemptible"}},
             error="gemma-tpu:tpu.capacity is 'preemptible'; choose one of on-demand, spot, reservation, flex-start"),
    BadStack(case="reservation without a name", config={"gemma-tpu:tpu": {"capacity": "reservation"}},
             error="gemma-tpu:tpu.reservation is required with capacity: reservation; give the reservation's name"),
    BadStack(case="reservation name without capacity reservation",
             config={"gemma-tpu:tpu": {"capacity": "spot", "reservation": "my-reservation"}},
             error="gemma-tpu:tpu.reservation is set but gemma-tpu:tpu.capacity is 'spot'; set capacity: reservation or remove the reservation"),
    BadStack(case="flex-start on Autopilot",
             config={"gemma-tpu:cluster": {"mode": "autopilot"}, "gemma-tpu:tpu": {"capacity": "flex-start"}},
             error="gemma-tpu:tpu.capacity 'flex-start' is not supported with gemma-tpu:cluster.mode autopilot; choose one of on-demand, spot"),
    BadStack(case="reservation path not of a shared reservation",
             config={"gemma-tpu:tpu": {"capacity": "reservation", "reservation": "zones/us-east5-b/reservations/r"}},
             error="gemma-tpu:tpu.reservation 'zones/us-east5-b/reservations/r' is not a reservation; give its name (such as "
                   "my-tpus) or, for a reservation shared from another project, projects/OWNER_PROJECT/reservations/NAME"),
    BadStack(case="no data cache", config={"gemma-tpu:storage": {"dataCacheGiB": 0}},
             error="gemma-tpu:storage.dataCacheGiB is 0; it must be between 1 and 1000"),
    BadStack(case="reservation on Autopilot",
             config={"gemma-tpu:cluster": {"mode": "autopilot"}, "gemma-tpu:tpu": {"capacity": "reservation", "reservation": "r"}},
             error="gemma-tpu:tpu.capacity 'reservation' is not supported with gemma-tpu:cluster.mode autopilot; choose one of on-demand, spot"),
    BadStack(case="protect that is not true or false", config={"gemma-tpu:protect": "yes please"},
             error="gemma-tpu:protect must be true or false, got 'yes please'"),
    BadStack(case="keepArtifacts that is not true or false", config={"gemma-tpu:storage": {"keepArtifacts": "always"}},
             error="gemma-tpu:storage.keepArtifacts must be true or false, got 'always'"),
    BadStack(case="bucket name with google", config={"gemma-tpu:storage": {"dataBucket": "my-google-data"}},
             error="gemma-tpu:storage.dataBucket: 'my-google-data' is not a valid bucket name (3-63 of a-z, 0-9, '-', '_', '.', "
             "no 'google'); set a valid name there"),
    BadStack(case="bucket name with capitals", config={"gemma-tpu:storage": {"artifactsBucket": "Runs"}},
             error="gemma-tpu:storage.artifactsBucket: 'Runs' is not a valid bucket name (3-63 of a-z, 0-9, '-', '_', '.', "
             "no 'google'); set a valid name there"),
    BadStack(case="same bucket twice", config={"gemma-tpu:storage": {"dataBucket": "shared", "artifactsBucket": "shared"}},
             error="gemma-tpu:storage.artifactsBucket must differ from gemma-tpu:storage.dataBucket"),
    BadStack(case="image with a space", config={"gemma-tpu:image": "my image"},
             error="gemma-tpu:image 'my image' is not an image URI; leave it empty to build trainer/"),
    BadStack(case="namespace not a Kubernetes name", config={"gemma-tpu:namespace": "Training"},
             error="gemma-tpu:namespace 'Training' must be at most 63 characters of a-z, 0-9 and '-', starting with a letter"),
    BadStack(case="ServiceAccount not a Kubernetes name", config={"gemma-tpu:serviceAccount": "trainer_sa"},
             error="gemma-tpu:serviceAccount 'trainer_sa' must be at most 58 characters of a-z, 0-9 and '-', starting with a letter"),
    BadStack(case="existing network without its subnetwork", config={"gemma-tpu:network": {"name": "shared-vpc"}},
             error="gemma-tpu:network.name and gemma-tpu:network.subnetwork go together: name an existing network and its "
             "subnetwork, or leave both empty for the stack's own network"),
    BadStack(case="the project's default network", config={"gemma-tpu:network": {"name": "default", "subnetwork": "default"}},
             error="gemma-tpu:network.name is 'default', the project's auto-mode network with open firewall rules; leave it "
             "empty for the stack's own network or name a network made for the cluster"),
    BadStack(case="existing network without its secondary ranges",
             config={"gemma-tpu:network": {"name": "shared-vpc", "subnetwork": "gke-east5"}},
             error="gemma-tpu:network.podRangeName and gemma-tpu:network.serviceRangeName are required with an existing "
             "network: the secondary ranges of gke-east5 for pods and services"),
    BadStack(case="overlapping ranges", config={"gemma-tpu:network": {"podCidr": "10.0.0.0/14"}},
             error="gemma-tpu:network.nodeCidr 10.0.0.0/20 overlaps gemma-tpu:network.podCidr 10.0.0.0/14; give them "
             "disjoint ranges"),
    BadStack(case="a pod range too small for the nodes", config={"gemma-tpu:tpu": MULTISLICE, "gemma-tpu:network": {"podCidr": "10.4.0.0/22"}},
             error="gemma-tpu:network.podCidr 10.4.0.0/22 holds pod ranges for 4 nodes (a /24 each), but the stack's node "
             "pools reach 10 nodes; give it a /20 or larger"),
    BadStack(case="a node range too small for the nodes", config={"gemma-tpu:network": {"nodeCidr": "10.0.0.0/29"}},
             error="gemma-tpu:network.nodeCidr 10.0.0.0/29 holds 4 node addresses, but the stack's node pools reach 6 nodes; "
             "give it a /28 or larger"),
    BadStack(case="public node range", config={"gemma-tpu:network": {"nodeCidr": "8.8.0.0/20"}},
             error="gemma-tpu:network.nodeCidr is '8.8.0.0/20'; use a private IPv4 range (10/8, 172.16/12, 192.168/16)"),
    BadStack(case="control plane open to the internet", config={"gemma-tpu:cluster": {"authorizedNetworks": ["0.0.0.0/0"]}},
             error="gemma-tpu:cluster.authorizedNetworks holds 0.0.0.0/0, which opens the control plane to the internet; "
             "list your own ranges (kubectl and pulumi also reach it through its DNS endpoint)"),
    BadStack(case="more authorized networks than GKE takes",
             config={"gemma-tpu:cluster": {"authorizedNetworks": [f"203.0.113.{i}/32" for i in range(51)]}},
             error="gemma-tpu:cluster.authorizedNetworks lists 51 ranges; GKE takes at most 50: merge them into wider "
             "ranges (the DNS endpoint needs none)"),
    BadStack(case="maintenance window too short", config={"gemma-tpu:cluster": {"maintenanceDays": ["SU"], "maintenanceHours": 4}},
             error="gemma-tpu:cluster.maintenanceDays x gemma-tpu:cluster.maintenanceHours gives 16 hours in 32 days; GKE "
             "needs at least 48: add days or hours"),
    BadStack(case="unknown model", config={"gemma-tpu:training": {"model": "gemma2-2b"}},
             error="gemma-tpu:training.model is 'gemma2-2b'; choose one of gemma3-270m, gemma3-1b, gemma3-4b, gemma3-12b, gemma3-27b"),
    BadStack(case="the trainer's demo model", config={"gemma-tpu:training": {"model": "tiny"}},
             error="gemma-tpu:training.model is 'tiny', the trainer's local CPU demo model, whose tokenizer is trained on "
             "the demo's own data; choose one of gemma3-270m, gemma3-1b, gemma3-4b, gemma3-12b, gemma3-27b (run the "
             "demo with `make demo`)"),
    BadStack(case="weights neither a choice nor gs://", config={"gemma-tpu:training": {"weights": "latest"}},
             error="gemma-tpu:training.weights is 'latest'; choose one of official, random, or a gs:// checkpoint or Hugging Face directory"),
    BadStack(case="dataset not a URL", config={"gemma-tpu:training": {"dataset": "ftp://x/y.txt"}},
             error="gemma-tpu:training.dataset is 'ftp://x/y.txt'; give an https:// URL or a gs:// path"),
    BadStack(case="sequence too short", config={"gemma-tpu:training": {"seqLen": 8}},
             error="gemma-tpu:training.seqLen is 8; it must be between 16 and 32768"),
    BadStack(case="zero steps", config={"gemma-tpu:training": {"steps": 0}},
             error="gemma-tpu:training.steps is 0; it must be at least 1"),
    BadStack(case="text learning rate", config={"gemma-tpu:training": {"learningRate": "fast"}},
             error="gemma-tpu:training.learningRate must be a number, got 'fast'"),
    BadStack(case="zero learning rate", config={"gemma-tpu:training": {"learningRate": 0}},
             error="gemma-tpu:training.learningRate is 0; it must be above 0.0 and at most 1.0"),
    BadStack(case="negative LoRA rank", config={"gemma-tpu:training": {"loraRank": -1}},
             error="gemma-tpu:training.loraRank is -1; it must be between 0 and 1024"),
    BadStack(case="batch not divisible by the hosts", config={"gemma-tpu:tpu": MULTISLICE, "gemma-tpu:training": {"batchSize": 6}},
             error="gemma-tpu:training.batchSize is 6; it must be divisible by the 4 hosts of 2 x 2x4 slices (each host loads an equal share)"),
    BadStack(case="an FSDP group that does not divide a slice", config={"gemma-tpu:tpu": MULTISLICE, "gemma-tpu:training": {"fsdp": 3}},
             error="gemma-tpu:training.fsdp is 3; it must divide the 8 chips of a 2x4 slice (1, 2, 4, 8); "
                   "`python -m workloads fit --stack NAME --splits` compares them"),
    BadStack(case="a local checkpoint interval that is not steps", config={"gemma-tpu:training": {"localCheckpointInterval": 0}},
             error="gemma-tpu:training.localCheckpointInterval is 0; give auto or a number of steps (1 or more), or remove the key "
                   "for no local checkpoint tier"),
    BadStack(case="a local checkpoint tier larger than the host's memory",
             config={"gemma-tpu:tpu": {"accelerator": "v5e", "topology": "2x4"},
                     "gemma-tpu:training": {"model": "gemma3-12b", "batchSize": 8, "localCheckpointInterval": "auto"}},
             error="gemma-tpu:training.localCheckpointInterval: the local checkpoint tier needs 264.7 GiB of host memory on each "
                   "ct5lp-hightpu-4t host (3 copies of its 65.7 GiB share of the gemma3-12b float32 state, 1 GiB margin, and the "
                   "copy a save writes from), over the 160 GiB the trainer has there; set precision: lean (its tier needs 132.9 GiB) "
                   "or loraRank, or remove "
                   "localCheckpointInterval (the persistent tier alone)"),
    BadStack(case="run name not a DNS label", config={"gemma-tpu:training": {"runName": "Run_1"}},
             error="gemma-tpu:training.runName 'Run_1' must be at most 54 characters of a-z, 0-9 and '-', starting with a letter"),
    BadStack(case="run name too long for the Job's pod label", config={"gemma-tpu:training": {"runName": "r" * 55}},
             error=f"gemma-tpu:training.runName '{'r' * 55}' is too long for 1 slice of v6e 1x1: the Job name (the job-name "
                   f"label of its pod) would be '{'r' * 55}-xxxxxxxx' (x: the run's hash), 64 characters, and Kubernetes "
                   "allows 63; use at most 54 characters"),
    BadStack(case="run name too long for the multislice coordinator",
             config={"gemma-tpu:tpu": MULTISLICE, "gemma-tpu:training": {"runName": "r" * 18}},
             error=f"gemma-tpu:training.runName '{'r' * 18}' is too long for 2 slices of v6e 2x4: the coordinator address "
                   f"(a label value) would be '{'r' * 18}-xxxxxxxx-slice-0-0.{'r' * 18}-xxxxxxxx' (x: the run's hash), 65 "
                   "characters, and Kubernetes allows 63; use at most 17 characters"),
    BadStack(case="unknown way to handle bad rows", config={"gemma-tpu:training": {"onBadRow": "ignore"}},
             error="gemma-tpu:training.onBadRow is 'ignore'; choose one of fail, skip"),
    BadStack(case="two runs with one name", config={"gemma-tpu:queue": QUEUED, "gemma-tpu:runs": [{"name": "sweep"}, {"name": "sweep"}]},
             error="gemma-tpu:runs[1].name 'sweep' is also gemma-tpu:runs[0].name; give each run its own name"),
    BadStack(case="several runs without the queue", config={"gemma-tpu:runs": [{"name": "a"}, {"name": "b"}]},
             error="gemma-tpu:runs holds 2 runs on one set of TPU pools; set gemma-tpu:queue.enabled true so that Kueue "
                   "admits them in turn (each whole or not at all)"),
    BadStack(case="a run without a name", config={"gemma-tpu:queue": QUEUED, "gemma-tpu:runs": [{"steps": 100}]},
             error="gemma-tpu:runs[0].name is required: give the run a name (a-z, 0-9, -)"),
    BadStack(case="runName beside a run list", config={"gemma-tpu:training": {"runName": "x"}, "gemma-tpu:runs": [{"name": "a"}]},
             error="gemma-tpu:training.runName names the single run of a stack without gemma-tpu:runs; with gemma-tpu:runs, "
                   "give each run its name there (name: ...) and remove runName"),
    BadStack(case="a run on a TPU shape the stack has no pool for",
             config={"gemma-tpu:tpu": MULTISLICE, "gemma-tpu:queue": QUEUED, "gemma-tpu:runs": [{"name": "big", "topology": "4x4"}]},
             error="gemma-tpu:runs[0].topology is '4x4', but the stack's TPU pools are v6e 2x4 (gemma-tpu:tpu); run it on "
                   "a stack with such pools or remove the key"),
    BadStack(case="a run on more slices than the stack has",
             config={"gemma-tpu:tpu": MULTISLICE, "gemma-tpu:queue": QUEUED, "gemma-tpu:runs": [{"name": "big", "slices": 3}]},
             error="gemma-tpu:runs[0].slices is 3; it must be between 1 and 2"),
    BadStack(case="a queue quota over the pools' capacity",
             config={"gemma-tpu:tpu": {"topology": "2x4"}, "gemma-tpu:queue": {"enabled": True, "tpuQuota": 16}},
             error="gemma-tpu:queue.tpuQuota is 16 chips, over the 8 chips the stack's TPU pools hold; set at most 8 "
                   "(or leave it unset: the pools' capacity)"),
    BadStack(case="flex-start through the queue on too old a GKE",
             config={"gemma-tpu:cluster": {"version": "1.32"}, "gemma-tpu:tpu": {"topology": "2x4", "capacity": "flex-start"},
                     "gemma-tpu:queue": QUEUED},
             error="gemma-tpu:cluster.version is 1.32, but flex-start TPU nodes through Kueue's queued provisioning need GKE "
                   "1.33.0-gke.1712000 or later; raise it or leave it unset (the release channel's default)"),
    BadStack(case="multi-tier checkpointing on Autopilot",
             config={"gemma-tpu:cluster": {"mode": "autopilot", "multiTierCheckpointing": MULTI_TIER}, "gemma-tpu:tpu": MULTISLICE,
                     "gemma-tpu:training": LOCAL_TIER},
             error="gemma-tpu:cluster.multiTierCheckpointing: GKE's multi-tier checkpointing is not available on Autopilot "
                   "clusters; set gemma-tpu:cluster.mode: standard, or remove multiTierCheckpointing"),
    BadStack(case="multi-tier checkpointing on too old a GKE",
             config={"gemma-tpu:cluster": {"version": "1.32.3-gke.1785000", "multiTierCheckpointing": MULTI_TIER},
                     "gemma-tpu:tpu": MULTISLICE, "gemma-tpu:training": LOCAL_TIER},
             error="gemma-tpu:cluster.version is 1.32.3-gke.1785000, but gemma-tpu:cluster.multiTierCheckpointing needs GKE "
                   "1.32.4-gke.1415000 or later; raise it or leave it unset (the release channel's default)"),
    BadStack(case="multi-tier checkpointing of one slice",
             config={"gemma-tpu:cluster": {"multiTierCheckpointing": MULTI_TIER}, "gemma-tpu:tpu": {"topology": "2x4"},
                     "gemma-tpu:training": LOCAL_TIER},
             error="gemma-tpu:cluster.multiTierCheckpointing: GKE's multi-tier checkpointing replicates each host's checkpoint "
                   "to the same host of another slice, and its sources assume a job of two or more slices (node pools); this "
                   "stack has one (gemma-tpu:tpu.slices): remove multiTierCheckpointing and keep "
                   "gemma-tpu:training.localCheckpointInterval (the tier in host memory, docs/stacks.md)"),
    BadStack(case="multi-tier checkpointing without a local tier",
             config={"gemma-tpu:cluster": {"multiTierCheckpointing": MULTI_TIER}, "gemma-tpu:tpu": MULTISLICE},
             error="gemma-tpu:cluster.multiTierCheckpointing: no run has a local checkpoint tier to put on its volume; set "
                   "gemma-tpu:training.localCheckpointInterval (auto or steps), or remove the key"),
    BadStack(case="a multi-tier RAM disk larger than the host's memory",
             config={"gemma-tpu:cluster": {"multiTierCheckpointing": MULTI_TIER},
                     "gemma-tpu:tpu": {"accelerator": "v5e", **MULTISLICE},
                     "gemma-tpu:training": {"model": "gemma3-12b", "batchSize": 8, **LOCAL_TIER}},
             error="gemma-tpu:cluster.multiTierCheckpointing: the node's RAM disk for the local checkpoint tier needs 264.7 GiB "
                   "of host memory on each ct5lp-hightpu-4t host (3 copies of its 65.7 GiB share of the gemma3-12b float32 "
                   "state, 1 GiB margin, and the copy a save writes from), over the 160 GiB the trainer has there; set "
                   "precision: lean (its tier needs 132.9 GiB) or loraRank, or remove localCheckpointInterval (the persistent "
                   "tier alone)"),
    BadStack(case="a multislice run through queued provisioning",
             config={"gemma-tpu:tpu": {**MULTISLICE, "capacity": "flex-start"}, "gemma-tpu:queue": QUEUED,
                     "gemma-tpu:runs": [{"name": "small", "slices": 1}, {"name": "big"}]},
             error="gemma-tpu:runs[1].slices is 2, but queued provisioning (flex-start capacity behind the queue) brings "
                   "the nodes of one slice a run; set it to 1, or choose another capacity"),
    BadStack(case="multislice through queued provisioning",
             config={"gemma-tpu:tpu": {**MULTISLICE, "capacity": "flex-start"}, "gemma-tpu:queue": QUEUED},
             error="gemma-tpu:tpu.slices is 2, but queued provisioning (flex-start capacity behind the queue) brings "
                   "the nodes of one slice a run; set it to 1, or choose another capacity"),
    BadStack(case="notification channel that is an address", config={"gemma-tpu:monitoring": {"notificationChannels": ["me@example.com"]}},
             error="gemma-tpu:monitoring.notificationChannels holds 'me@example.com', not a channel such as "
                   "projects/PROJECT/notificationChannels/123; list yours with `gcloud beta monitoring channels list`"),
    BadStack(case="utilization threshold over 100%", config={"gemma-tpu:monitoring": {"lowUtilizationPercent": 150}},
             error="gemma-tpu:monitoring.lowUtilizationPercent is 150; it must be above 0.0 and at most 100.0"),
    BadStack(case="alert window shorter than the metrics' delay", config={"gemma-tpu:monitoring": {"idleNodesMinutes": 1}},
             error="gemma-tpu:monitoring.idleNodesMinutes is 1; it must be between 5 and 1440"),
    BadStack(case="serving a run the stack does not have", config={"gemma-tpu:serving": {**SERVING, "run": "nope"}},
             error="gemma-tpu:serving.run is 'nope', which is no run of this stack; choose one of gemma-finetune"),
    BadStack(case="a vLLM image without a digest", config={"gemma-tpu:serving": {**SERVING, "image": "vllm/vllm-tpu:v0.27.0"}},
             error="gemma-tpu:serving.image 'vllm/vllm-tpu:v0.27.0' is not pinned by digest; give the vLLM TPU image as "
                   "vllm/vllm-tpu:TAG@sha256:DIGEST (docs/serving.md: `docker buildx imagetools inspect vllm/vllm-tpu:TAG`)"),
    BadStack(case="serving from a multi-host slice", config={"gemma-tpu:serving": {**SERVING, "topology": "4x4"}},
             error="gemma-tpu:serving.topology v6e 4x4 spans 4 hosts, and vLLM serves from one; choose one of 1x1, 2x2, 2x4"),
    BadStack(case="a serving slice too small for the model",
             config={"gemma-tpu:training": {"model": "gemma3-27b"}, "gemma-tpu:serving": SERVING},
             error="gemma-tpu:serving.topology v6e 1x1 cannot hold gemma3-27b: its bfloat16 weights and one 8192-token "
                   "sequence need 54.2 GiB a chip, and vLLM uses 28.8 GiB of each; choose 2x2 or 2x4, or lower gemma-tpu:serving.maxModelLen"),
    BadStack(case="a serving length above the model's", config={"gemma-tpu:serving": {**SERVING, "maxModelLen": 65536}},
             error="gemma-tpu:serving.maxModelLen is 65536, above gemma3-270m's 32768 (max_position_embeddings of its export); "
                   "set at most 32768"),
    BadStack(case="an adapter rank vLLM refuses",
             config={"gemma-tpu:training": {"loraRank": 1024}, "gemma-tpu:serving": {**SERVING, "lora": "adapter"}},
             error="gemma-tpu:serving.lora is adapter, but run 'gemma-finetune' has loraRank 1024 and vLLM serves adapters "
                   "of rank at most 512; use lora: merged (the run's export has the adapter merged in)"),
)


def markdown_table() -> str:
    rows = [case.table_row() for case in CASES]
    return "\n".join(["| case | in the stack file | what the user gets (exit code 2) |", "|---|---|---|", *rows])


if __name__ == "__main__":
    print(markdown_table())
