"""The stack config: documented defaults and the values a user sets. Invalid configs:
test_bad_stack_inputs.py."""

import pytest

from infra.config import parse_stack_config
from infra.config.training import TINYSTORIES_URL
from infra.config.stack_files import load_stack_file
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
    assert (config.region, config.zone, config.cluster_mode, config.protect) == ("us-east5", "us-east5-b", "standard", False)
    assert (config.tpu.accelerator, config.tpu.topology, config.tpu.slices, config.tpu.capacity) == (
        "v6e", "1x1", 1, "on-demand"
    )
    assert config.tpu.reservation is None
    assert (config.data_bucket, config.artifacts_bucket) == (f"{PROJECT_ID}-dev-data", f"{PROJECT_ID}-dev-artifacts")
    assert config.force_destroy and config.keep_artifacts  # a stack of your own keeps its checkpoints on destroy
    assert config.image is None
    assert (config.namespace, config.service_account, config.cluster_name) == ("training", "trainer", "gemma-dev")
    training = config.runs[0].training
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
        "queued": ("standard", "2x4", 2, 4),
        "serving": ("standard", "2x2", 1, 1),
    }


def test_user_choices_are_kept():
    config = parse(
        "prod",
        **{"gcp:region": "europe-west4", "gcp:zone": "europe-west4-a"},
        cluster={"mode": "autopilot"},
        protect=True,
        tpu={"accelerator": "v5p", "topology": "2x2x2", "slices": 2, "capacity": "spot"},
        storage={"dataBucket": "corpus", "artifactsBucket": "runs", "forceDestroy": False, "keepArtifacts": False},
        image="europe-docker.pkg.dev/p/r/trainer:1",
        training={"steps": 100, "loraRank": 8, "batchSize": 64, "runName": "lora-run"},
    )
    assert (config.zone, config.cluster_location, config.protect) == ("europe-west4-a", "europe-west4", True)
    assert (config.slice.machine_type, config.total_hosts, config.tpu.capacity) == ("ct5p-hightpu-4t", 4, "spot")
    assert (config.data_bucket, config.artifacts_bucket, config.force_destroy, config.keep_artifacts) == ("corpus", "runs", False, False)
    assert config.image == "europe-docker.pkg.dev/p/r/trainer:1"
    assert (config.runs[0].training.steps, config.runs[0].training.lora_rank, config.runs[0].training.run_name) == (100, 8, "lora-run")


def test_learning_rate_set_with_path_arrives_as_text_and_is_read():
    assert parse(training={"learningRate": "1e-4"}).runs[0].training.learning_rate == 1e-4


def test_a_stack_file_path_gives_its_stack_name(tmp_path):
    path = tmp_path / "Pulumi.team-a.yaml"
    path.write_text(f"config:\n  gcp:project: {PROJECT_ID}\n  gemma-tpu:tpu:\n    topology: 2x4\n")
    config = load_stack_file(path)
    assert (config.stack, config.cluster_name, config.slice.hosts) == ("team-a", "gemma-team-a", 2)


def test_flags_set_with_pulumi_config_set_arrive_as_text_and_are_read():
    # `pulumi config set gemma-tpu:protect true` stores "true", and the engine passes top-level values as text.
    assert parse(protect="true").protect is True
    assert parse(protect="false", storage={"keepArtifacts": "false"}).keep_artifacts is False


def test_a_model_added_to_the_trainers_table_is_one_the_stack_and_the_trainer_take(monkeypatch):
    from trainer import config as trainer_config

    monkeypatch.setitem(trainer_config.GEMMA3_MODELS, "gemma3-2b", ("Gemma3_2B", "GEMMA3_2B_PT"))
    assert parse(training={"model": "gemma3-2b"}).runs[0].training.model == "gemma3-2b"
    assert trainer_config.parse_config(["--model", "gemma3-2b", "--data", "corpus.txt"]).model == "gemma3-2b"


def test_training_defaults_are_the_trainers_and_the_pods_get_only_what_the_stack_sets():
    from infra.config.training import TRAINER_OPTIONS, trainer_flags
    from trainer.config import TrainConfig, parse_config

    training = parse().runs[0].training
    defaults = TrainConfig()
    stated = lambda config, option: getattr(config, option.field) if getattr(config, option.field) is not None or not \
        option.unset_when_default else option.default  # noqa: E731
    for option in TRAINER_OPTIONS:
        assert stated(training, option) == getattr(defaults, option.option), option.key
    assert "--precision" not in trainer_flags(training)  # a default kept unset adds no flag (and leaves the run's name)
    # What the pods pass parses back to the same options (epochs is left out once steps is set).
    for config in (training, parse(training={"steps": 40, "learningRate": 3e-4, "loraRank": 8, "precision": "lean"}).runs[0].training):
        parsed = parse_config([*trainer_flags(config), "--data", "corpus.txt"])
        for option in TRAINER_OPTIONS:
            if option.key != "epochs" or config.steps is None:
                assert getattr(parsed, option.option) == stated(config, option), option.key


def test_the_local_checkpoint_tier_is_off_unless_its_interval_is_set():
    interval = lambda value: parse(training={"localCheckpointInterval": value}).runs[0].training.local_checkpoint_interval  # noqa: E731
    assert parse().runs[0].training.local_checkpoint_interval is None
    assert (interval("auto"), interval(25)) == ("auto", "25")  # as the trainer's --local-checkpoint-interval takes it
    for bad in (0, -3, "often", True, 2.5):
        with pytest.raises(ConfigError, match=r"^gemma-tpu:training.localCheckpointInterval is .*; give auto or a number of steps "
                                              r"\(1 or more\), or remove the key for no local checkpoint tier$"):
            interval(bad)


def test_a_local_tier_that_does_not_fit_the_hosts_memory_is_refused_with_its_figures():
    v5e = {"accelerator": "v5e", "topology": "2x4"}
    # gemma3-12b float32 on 2 ct5lp-hightpu-4t hosts: 12 bytes x 11.77e9 / 2 = 65.7 GiB a host, 3 copies and 1 GiB
    # of volume plus the save's copy: 264.7 GiB over the trainer's 160; lean's (6 bytes) needs 132.9, the first that fits.
    with pytest.raises(ConfigError, match=r"^gemma-tpu:training.localCheckpointInterval: the local checkpoint tier needs 264.7 GiB "
                                          r"of host memory on each ct5lp-hightpu-4t host \(3 copies of its 65.7 GiB share of the "
                                          r"gemma3-12b float32 state, 1 GiB margin, and the copy a save writes from\), over the 160 "
                                          r"GiB the trainer has there; set precision: lean \(its tier needs 132.9 GiB\) or loraRank, or remove "
                                          r"localCheckpointInterval"):
        parse(tpu=v5e, training={"model": "gemma3-12b", "batchSize": 8, "localCheckpointInterval": "auto"})
    from infra.config.runs import local_tier_share_bytes
    from trainer.gemma3.config import MODELS
    from trainer.measure.flops import lora_param_count

    for fix in ({"precision": "lean"}, {"loraRank": 16}):
        config = parse(tpu=v5e, training={"model": "gemma3-12b", "batchSize": 8, "localCheckpointInterval": "auto", **fix})
    # LoRA's adapters are whole on every host: the share is all of them.
    assert local_tier_share_bytes(config.runs[0].training, config.slice) == 12 * lora_param_count(MODELS["gemma3-12b"], 16)
    parse(tpu=v5e, training={"model": "gemma3-12b", "batchSize": 8})  # no tier, nothing to fit
    # gemma3-27b: not even lean-factored's tier (4 bytes a parameter: 201 GiB) fits beside the trainer; only LoRA is named.
    with pytest.raises(ConfigError, match=r"over the 160 GiB the trainer has there; set loraRank, or remove localCheckpointInterval"):
        parse(tpu=v5e, training={"model": "gemma3-27b", "batchSize": 8, "localCheckpointInterval": "auto"})


def test_gradient_accumulation_is_passed_only_when_set_and_its_micro_batches_must_divide_over_the_chips():
    from infra.config.training import trainer_flags
    from trainer.config import parse_config

    accumulation = lambda **training: parse(training=training).runs[0].training  # noqa: E731
    for unset in (accumulation(), accumulation(gradAccumSteps=1)):  # the trainer's default: no flag, the run's name unchanged
        assert unset.grad_accum_steps is None and "--grad-accum-steps" not in trainer_flags(unset)
    four = accumulation(batchSize=64, gradAccumSteps=4)
    assert parse_config([*trainer_flags(four), "--data", "corpus.txt"]).grad_accum_steps == 4
    for bad, error in ((0, "is 0; it must be at least 1"), ("many", "must be an integer, got 'many'"), (True, "must be an integer, got True")):
        with pytest.raises(ConfigError, match=rf"^gemma-tpu:training.gradAccumSteps {error}$"):
            accumulation(gradAccumSteps=bad)
    v5e = {"accelerator": "v5e", "topology": "2x4"}
    parse(tpu=v5e, training={"batchSize": 64, "gradAccumSteps": 8})  # micro-batches of 8 rows, one a chip
    with pytest.raises(ConfigError, match=r"^gemma-tpu:training.gradAccumSteps is 16; batchSize 64 must split into that many "
                                          r"micro-batches, each a multiple of the 8 chips of 1 x 2x4 slices: give a batchSize "
                                          r"that is a multiple of 128, or fewer gradAccumSteps$"):
        parse(tpu=v5e, training={"batchSize": 64, "gradAccumSteps": 16})
