"""The stack config: documented defaults, and every invalid value stopped with a one-line message
that names the key and what is allowed."""

import pytest

from infra.config import TINYSTORIES_URL, load_stack_file, parse_stack_config, read_stack_values
from infra.errors import ConfigError
from tests.infra.conftest import PROJECT_ID, SHIPPED_STACKS, stack_values


def parse(stack: str = "dev", **sections) -> object:
    """A config with a project and the given `gemma-tpu:` sections (keyword = section name)."""
    values = {"gcp:project": PROJECT_ID}
    for name, section in sections.items():
        values[name if ":" in name else f"gemma-tpu:{name}"] = section
    return parse_stack_config(values, stack)


def test_defaults_are_the_documented_ones():
    config = parse()
    assert (config.region, config.zone, config.cluster_mode, config.deletion_protection) == (
        "us-east5", "us-east5-b", "standard", False
    )
    assert (config.tpu.accelerator, config.tpu.topology, config.tpu.slices, config.tpu.capacity) == (
        "v6e", "1x1", 1, "on-demand"
    )
    assert config.tpu.reservation is None
    assert (config.data_bucket, config.artifacts_bucket) == (f"{PROJECT_ID}-dev-data", f"{PROJECT_ID}-dev-artifacts")
    assert config.force_destroy and config.image is None
    assert (config.namespace, config.service_account, config.cluster_name) == ("training", "trainer", "gemma-dev")
    training = config.training
    assert (training.model, training.weights, training.dataset) == ("gemma3-270m", "official", TINYSTORIES_URL)
    assert (training.seq_len, training.batch_size, training.steps, training.epochs) == (256, 128, None, 1)
    assert (training.learning_rate, training.lora_rank, training.checkpoint_interval) == (2.0e-5, 0, 500)
    assert (training.max_restarts, training.profiling, training.run_name) == (10, False, "gemma-finetune")


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_shipped_stack_files_ask_for_a_project_first(stack):
    with pytest.raises(ConfigError, match=r"^gcp:project is required: run `pulumi config set gcp:project"):
        load_stack_file(stack)


def test_shipped_stacks_have_their_shapes():
    shapes = {
        stack: (c.cluster_mode, c.slice.topology, c.tpu.slices, c.total_hosts)
        for stack in SHIPPED_STACKS
        for c in [parse_stack_config(stack_values(stack), stack)]
    }
    assert shapes == {
        "dev": ("standard", "1x1", 1, 1),
        "multihost": ("standard", "2x4", 1, 2),
        "multislice": ("standard", "2x4", 2, 4),
        "autopilot": ("autopilot", "1x1", 1, 1),
    }


def test_user_choices_are_kept():
    config = parse(
        "prod",
        **{"gcp:region": "europe-west4", "gcp:zone": "europe-west4-a"},
        cluster={"mode": "autopilot", "deletionProtection": True},
        tpu={"accelerator": "v5p", "topology": "2x2x2", "slices": 2, "capacity": "spot"},
        storage={"dataBucket": "corpus", "artifactsBucket": "runs", "forceDestroy": False},
        image="europe-docker.pkg.dev/p/r/trainer:1",
        training={"steps": 100, "loraRank": 8, "batchSize": 64, "runName": "lora-run"},
    )
    assert (config.zone, config.cluster_location, config.deletion_protection) == ("europe-west4-a", "europe-west4", True)
    assert (config.slice.machine_type, config.total_hosts, config.tpu.capacity) == ("ct5p-hightpu-4t", 4, "spot")
    assert (config.data_bucket, config.artifacts_bucket, config.force_destroy) == ("corpus", "runs", False)
    assert config.image == "europe-docker.pkg.dev/p/r/trainer:1"
    assert (config.training.steps, config.training.lora_rank, config.training.run_name) == (100, 8, "lora-run")


def test_learning_rate_set_with_path_arrives_as_text_and_is_read():
    assert parse(training={"learningRate": "1e-4"}).training.learning_rate == 1e-4


MULTISLICE = {"topology": "2x4", "slices": 2}

# (stack config sections, the message it must give: key and allowed values)
INVALID = {
    "unknown topology": (
        {"tpu": {"topology": "3x3"}},
        "gemma-tpu:tpu.topology: topology '3x3' is not a v6e slice; choose one of 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16",
    ),
    "topology of another accelerator": (
        {"tpu": {"accelerator": "v5p", "topology": "2x4"}},
        "gemma-tpu:tpu.topology: topology '2x4' is not a v5p slice; choose one of 2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4",
    ),
    "unknown accelerator": (
        {"tpu": {"accelerator": "v4"}},
        "gemma-tpu:tpu.accelerator is 'v4'; choose one of v6e, v5e, v5p",
    ),
    "multislice of single-host slices": (
        {"tpu": {"topology": "2x2", "slices": 2}},
        "gemma-tpu:tpu.slices is 2 but v6e 2x2 is a single-host slice; multislice needs a multi-host topology "
        "(2x4, 4x4, 4x8, 8x8, 8x16, 16x16) or slices: 1",
    ),
    "zone outside the region": (
        {"gcp:region": "us-east5", "gcp:zone": "us-central1-a"},
        "gcp:zone 'us-central1-a' is not in gcp:region 'us-east5'; use a zone such as us-east5-b",
    ),
    "reservation without a name": (
        {"tpu": {"capacity": "reservation"}},
        "gemma-tpu:tpu.reservation is required with capacity: reservation; give the reservation's name",
    ),
    "reservation name without capacity reservation": (
        {"tpu": {"capacity": "spot", "reservation": "my-reservation"}},
        "gemma-tpu:tpu.reservation is set but gemma-tpu:tpu.capacity is 'spot'; set capacity: reservation or remove the reservation",
    ),
    "flex-start on Autopilot": (
        {"cluster": {"mode": "autopilot"}, "tpu": {"capacity": "flex-start"}},
        "gemma-tpu:tpu.capacity 'flex-start' is not supported with gemma-tpu:cluster.mode autopilot; choose one of on-demand, spot",
    ),
    "reservation on Autopilot": (
        {"cluster": {"mode": "autopilot"}, "tpu": {"capacity": "reservation", "reservation": "r"}},
        "gemma-tpu:tpu.capacity 'reservation' is not supported with gemma-tpu:cluster.mode autopilot; choose one of on-demand, spot",
    ),
    "unknown capacity": (
        {"tpu": {"capacity": "preemptible"}},
        "gemma-tpu:tpu.capacity is 'preemptible'; choose one of on-demand, spot, reservation, flex-start",
    ),
    "unknown cluster mode": (
        {"cluster": {"mode": "gke"}},
        "gemma-tpu:cluster.mode is 'gke'; choose one of standard, autopilot",
    ),
    "unknown top-level key": (
        {"gemma-tpu:tpus": {"slices": 2}},
        "gemma-tpu:tpus is not a known key; the keys here are gcp:project, gcp:region, gcp:zone, gemma-tpu:cluster, "
        "gemma-tpu:tpu, gemma-tpu:storage, gemma-tpu:image, gemma-tpu:namespace, gemma-tpu:serviceAccount, gemma-tpu:training",
    ),
    "unknown nested key": (
        {"tpu": {"topolgy": "2x4"}},
        "gemma-tpu:tpu.topolgy is not a known key; the keys here are accelerator, topology, slices, capacity, reservation",
    ),
    "nested key set without --path": (
        {"gemma-tpu:tpu.slices": 2},
        "gemma-tpu:tpu.slices is not a known key; to set a key inside gemma-tpu:tpu, run "
        "`pulumi config set --path 'gemma-tpu:tpu.slices' VALUE`",
    ),
    "text for learning rate": (
        {"training": {"learningRate": "fast"}},
        "gemma-tpu:training.learningRate must be a number, got 'fast'",
    ),
    "string for slices": ({"tpu": {"slices": "2"}}, "gemma-tpu:tpu.slices must be an integer, got '2'"),
    "boolean for slices": ({"tpu": {"slices": True}}, "gemma-tpu:tpu.slices must be an integer, got True"),
    "section that is not a mapping": (
        {"tpu": "v6e-8"},
        "gemma-tpu:tpu must be a mapping of keys to values, got 'v6e-8'",
    ),
    "sequence too short": ({"training": {"seqLen": 8}}, "gemma-tpu:training.seqLen is 8; it must be between 16 and 32768"),
    "negative LoRA rank": ({"training": {"loraRank": -1}}, "gemma-tpu:training.loraRank is -1; it must be between 0 and 1024"),
    "zero learning rate": (
        {"training": {"learningRate": 0}},
        "gemma-tpu:training.learningRate is 0; it must be above 0.0 and at most 1.0",
    ),
    "batch not divisible by hosts": (
        {"tpu": MULTISLICE, "training": {"batchSize": 6}},
        "gemma-tpu:training.batchSize is 6; it must be divisible by the 4 hosts of 2 x 2x4 slices (each host loads an equal share)",
    ),
    "unknown model": (
        {"training": {"model": "gemma2-2b"}},
        "gemma-tpu:training.model is 'gemma2-2b'; choose one of gemma3-270m, gemma3-1b, gemma3-4b, gemma3-12b, gemma3-27b, tiny",
    ),
    "dataset not a URL": (
        {"training": {"dataset": "ftp://x/y.txt"}},
        "gemma-tpu:training.dataset is 'ftp://x/y.txt'; give an https:// URL or a gs:// path",
    ),
    "weights neither a choice nor gs://": (
        {"training": {"weights": "latest"}},
        "gemma-tpu:training.weights is 'latest'; choose one of official, random or a gs:// checkpoint",
    ),
    "namespace not a DNS label": (
        {"namespace": "Training"},
        "gemma-tpu:namespace 'Training' must be at most 63 characters of a-z, 0-9 and '-', starting with a letter",
    ),
    "bucket name with google": (
        {"storage": {"dataBucket": "my-google-data"}},
        "gemma-tpu:storage.dataBucket: 'my-google-data' is not a valid bucket name",
    ),
    "same bucket twice": (
        {"storage": {"dataBucket": "shared", "artifactsBucket": "shared"}},
        "gemma-tpu:storage.artifactsBucket must differ from gemma-tpu:storage.dataBucket",
    ),
    "missing project": ({"gcp:project": ""}, "gcp:project is required: run `pulumi config set gcp:project YOUR_PROJECT_ID`"),
}


@pytest.mark.parametrize("sections,message", INVALID.values(), ids=INVALID.keys())
def test_invalid_config_is_rejected_with_its_message(sections, message):
    with pytest.raises(ConfigError) as error:
        parse(**sections)
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_stack_name_must_fit_the_derived_names():
    with pytest.raises(ConfigError, match=r"^the stack name 'a-very-long-stack-name' must be at most 18 characters"):
        parse("a-very-long-stack-name")


def test_stack_file_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"no stack file .*Pulumi\.staging\.yaml; the stacks here are autopilot, dev, multihost, multislice"):
        read_stack_values("staging")
    broken = tmp_path / "Pulumi.broken.yaml"
    broken.write_text("config:\n  gemma-tpu:tpu: {slices: 2\n")
    with pytest.raises(ConfigError, match=r"Pulumi\.broken\.yaml is not valid YAML"):
        read_stack_values(broken)


def test_a_stack_file_path_gives_its_stack_name(tmp_path):
    path = tmp_path / "Pulumi.team-a.yaml"
    path.write_text(f"config:\n  gcp:project: {PROJECT_ID}\n  gemma-tpu:tpu:\n    topology: 2x4\n")
    config = load_stack_file(path)
    assert (config.stack, config.cluster_name, config.slice.hosts) == ("team-a", "gemma-team-a", 2)
