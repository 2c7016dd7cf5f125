"""Publishing an export for serving: the trainer's final export and `trainer.export --publish` add a
version beside the earlier ones, never over one, to a folder or a gs:// bucket, its marker last; a
version without its marker (one being copied, or a copy that died) is not one; a relaunch of a
finished run publishes nothing new."""

import datetime
import importlib
import json
import pathlib

import pytest
from etils.epath import backend, gpath
from fsspec.implementations.memory import MemoryFile, MemoryFileSystem

from tests.trainer.hf.test_export import train
from trainer import contract, loop, run_identity
from trainer.hf import publish
from trainer.export import main as export_main
from trainer.hf.publish import main as publish_main
from trainer.config import parse_config
from trainer.errors import UserError

NOON = datetime.datetime(2026, 12, 5, 12, 0, 0, tzinfo=datetime.timezone.utc)


@pytest.fixture(scope="module")
def published_run(tmp_path_factory, prepared_dir, tokenizer_path):
    folder = tmp_path_factory.mktemp("publish")
    workdir = train(folder / "run-a1b2", prepared_dir, tokenizer_path, "--publish-dir", str(folder / "published"))
    return workdir, folder / "published"


def test_the_trainer_publishes_its_final_export_as_a_complete_version(published_run):
    workdir, published = published_run
    (version,) = publish.published_versions(published)
    run = run_identity.recorded(workdir)
    assert run.startswith("run-a1b2-") and version.endswith(f"-{run}.hf")  # which run, what it holds
    assert contract.published_version_parts(version) == ("hf",)
    copied = published / version / contract.PUBLISHED_MODEL_DIR
    assert sorted(path.name for path in copied.iterdir()) == sorted(path.name for path in (workdir / "export" / "hf").iterdir())
    assert json.loads((published / version / contract.PUBLISHED_MARKER_FILE).read_text())["run"] == run


def test_a_new_version_goes_beside_the_old_and_sorts_after_it(published_run, tmp_path):
    workdir, _ = published_run
    versions = tmp_path / "versions"
    first = publish.publish_run(workdir, versions)
    later = publish.publish(versions, "run-c3d4", {"hf": workdir / "export" / "hf"}, now=datetime.datetime(2099, 1, 1, tzinfo=datetime.timezone.utc))
    assert publish.published_versions(versions) == [first.name, later.name]
    with pytest.raises(UserError, match="already published"):
        publish.publish(versions, "run-c3d4", {"hf": workdir / "export" / "hf"}, now=datetime.datetime(2099, 1, 1, tzinfo=datetime.timezone.utc))
    assert (later / contract.PUBLISHED_MARKER_FILE).is_file()


def test_a_version_without_its_marker_is_not_listed(published_run, tmp_path):
    workdir, _ = published_run
    versions = tmp_path / "versions"
    version = publish.publish(versions, "run", {"hf": workdir / "export" / "hf"}, now=NOON)
    (version / contract.PUBLISHED_MARKER_FILE).unlink()  # as a copy that died before its marker
    (versions / ".partial-copy").mkdir()
    assert publish.published_versions(versions) == []
    assert version.name == "20261205T120000Z-run.hf"


def test_export_publish_and_the_cli_add_versions(published_run, tmp_path, capsys):
    workdir, _ = published_run
    versions = tmp_path / "versions"
    assert export_main(["--run", str(workdir), "--out", str(tmp_path / "hf"), "--dtype", "float32", "--publish", str(versions)]) == contract.OK
    assert "published" in capsys.readouterr().out
    (version,) = publish.published_versions(versions)
    assert (versions / version / "hf" / "config.json").is_file()
    assert publish_main(["--run", str(workdir), "--publish-dir", str(tmp_path / "other")]) == contract.OK
    assert len(publish.published_versions(tmp_path / "other")) == 1


def test_export_publishes_only_a_whole_model(published_run, tmp_path, capsys):
    workdir, _ = published_run
    argv = ["--run", str(workdir), "--out", str(tmp_path / "adapter"), "--lora-export", "adapter", "--publish", str(tmp_path / "v")]
    assert export_main(argv) == contract.USER_ERROR
    assert "--part base --part adapter" in capsys.readouterr().err and not (tmp_path / "v").exists()


def test_nothing_to_publish_is_one_line(tmp_path, capsys):
    assert publish_main(["--run", str(tmp_path), "--publish-dir", str(tmp_path / "out")]) == contract.USER_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no Hugging Face export there" in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


class _Object(MemoryFile):
    """A bucket's object: it appears, whole, when its writer closes it."""

    def close(self):
        if self.fs.store.get(self.path) is not self:
            self.commit()
            self.fs.written.append(self.path)


class _Bucket(MemoryFileSystem):
    """gs:// as Cloud Storage behaves for what publishing does, in memory: one bucket, `bucket`; objects
    that appear whole when closed (in `written`, in that order); folders that are only the prefixes of
    object names (making one makes nothing)."""

    protocol = ("gs", "gcs")
    store: dict = {}
    pseudo_dirs = ["", "/bucket"]
    written: list = []

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(str(path).removeprefix("gs://").removeprefix("gcs://"))

    def mkdir(self, path, create_parents=True, **kwargs):
        pass

    def makedirs(self, path, exist_ok=False):
        pass

    def _open(self, path, mode="rb", **kwargs):
        if mode == "wb":
            return _Object(self, self._strip_protocol(path))
        return super()._open(path, mode, **kwargs)


@pytest.fixture(scope="module")
def bucket():
    """gs:// through etils.epath onto _Bucket, with fsspec as in the trainer's image (which has no
    TensorFlow: the dev venv's would take gs:// to tf.io.gfile)."""
    _Bucket.store.clear()
    _Bucket.written.clear()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gpath, "_is_tf_installed", lambda: False)
        for protocol in _Bucket.protocol:
            patch.setitem(importlib.import_module("fsspec.registry")._registry, protocol, _Bucket)
        backend.fsspec_backend._get_filesystem.cache_clear()
        yield _Bucket
    backend.fsspec_backend._get_filesystem.cache_clear()


def _objects(bucket, prefix: str) -> dict[str, bytes]:
    return {name.removeprefix(prefix): file.getvalue() for name, file in bucket.store.items() if name.startswith(prefix)}


def test_publishing_to_a_bucket_writes_the_version_there_its_marker_last(published_run, bucket, tmp_path, monkeypatch):
    workdir, _ = published_run
    monkeypatch.chdir(tmp_path)
    bucket.written.clear()
    assert publish_main(["--run", str(workdir), "--publish-dir", "gs://bucket/published/run-a1b2"]) == contract.OK
    assert not any(tmp_path.iterdir())  # no local folder named gs:
    (version,) = publish.published_versions("gs://bucket/published/run-a1b2")
    prefix = f"/bucket/published/run-a1b2/{version}/"
    hf = workdir / "export" / "hf"
    assert _objects(bucket, prefix) == {**{f"hf/{path.name}": path.read_bytes() for path in hf.iterdir()},
                                        contract.PUBLISHED_MARKER_FILE: bucket.store[prefix + contract.PUBLISHED_MARKER_FILE].getvalue()}
    assert bucket.written[-1] == prefix + contract.PUBLISHED_MARKER_FILE and len(bucket.written) == len(list(hf.iterdir())) + 1
    assert json.loads(bucket.store[prefix + contract.PUBLISHED_MARKER_FILE].getvalue())["parts"] == ["hf"]


def test_a_publish_dir_under_a_file_is_one_line(published_run, tmp_path, capsys):
    workdir, _ = published_run
    (tmp_path / "notes").write_text("a file")
    assert publish_main(["--run", str(workdir), "--publish-dir", str(tmp_path / "notes" / "published")]) == contract.USER_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--publish-dir {tmp_path / 'notes' / 'published'}: {tmp_path / 'notes'} is a file" in err


def test_an_empty_publish_dir_is_refused_in_one_line_by_each_command(published_run, tmp_path, monkeypatch, capsys):
    """`--publish-dir ''` published into the current folder and exited 0; `trainer.export --publish ''` published
    nothing and said nothing."""
    workdir, _ = published_run
    monkeypatch.chdir(tmp_path)
    assert publish_main(["--run", str(workdir), "--publish-dir", ""]) == contract.USER_ERROR
    assert capsys.readouterr().err == ("trainer.hf.publish: error: --publish-dir '': empty; give a folder or a gs:// path "
                                       "to publish versions in\n")
    assert export_main(["--run", str(workdir), "--out", str(tmp_path / "hf"), "--publish", ""]) == contract.USER_ERROR
    assert capsys.readouterr().err == ("trainer.export: error: --publish '': empty; give a folder or a gs:// path to "
                                       "publish versions in\n")
    assert list(tmp_path.iterdir()) == []


def test_another_runs_marker_that_is_no_object_is_passed_over(tmp_path):
    """A published.json holding a JSON list made the finished run exit 1 (AttributeError) and publish nothing."""
    published = tmp_path / "published"
    odd = published / "20260101T000000Z-other"
    odd.mkdir(parents=True)
    (odd / contract.PUBLISHED_MARKER_FILE).write_text("[1, 2]\n")
    warnings = []
    assert publish.published_step(str(published), "nobody", 1, ("hf",), warn=warnings.append) is None
    assert warnings == [f"{odd / contract.PUBLISHED_MARKER_FILE}: not a version's marker (a JSON list, not an object); "
                        "that version is left out"]


def _export(workdir: pathlib.Path) -> pathlib.Path:
    """A run folder as the trainer leaves it, its identity recorded, with an export to publish."""
    (workdir / "export" / "hf").mkdir(parents=True)
    (workdir / "export" / "hf" / "config.json").write_text("{}")
    run_identity.record(workdir, {"steps": 3})
    return workdir


def test_two_runs_in_folders_of_one_name_publish_to_one_folder_as_two_runs(tmp_path, capsys):
    """a/train and b/train were one run to the publish folder (its folder's name): the second run's export
    was 'published already' and never published."""
    published = str(tmp_path / "published")
    first, second = _export(tmp_path / "a" / "train"), _export(tmp_path / "b" / "train")
    for workdir in (first, second):
        loop.publish_export(workdir, published, ("hf",), step=3)
    assert "published already" not in capsys.readouterr().err
    versions = publish.published_versions(published)
    assert len(versions) == 2 and {json.loads((tmp_path / "published" / version / contract.PUBLISHED_MARKER_FILE).read_text())["run"]
                                   for version in versions} == {run_identity.identity(first), run_identity.identity(second)}
    loop.publish_export(second, published, ("hf",), step=3)  # a relaunch of the finished second run
    assert "published already" in capsys.readouterr().err and len(publish.published_versions(published)) == 2


def test_a_runs_identity_is_recorded_once_and_a_run_from_before_identities_keeps_its_folders_name(tmp_path):
    workdir = tmp_path / "train"
    workdir.mkdir()
    run = run_identity.record(workdir, {"steps": 3})
    assert run_identity.record(workdir, {"steps": 30}) == run == run_identity.identity(workdir)  # a longer relaunch
    assert run_identity.new_identity(tmp_path / "other" / "train", {"steps": 3}) != run
    assert run_identity.new_identity(workdir, {"steps": 4}) != run
    older = tmp_path / "older"
    older.mkdir()
    (older / "config.json").write_text("{}")  # a run that began before identities: its versions name its folder
    assert run_identity.identity(older) == "older" == run_identity.record(older, {"steps": 3}) == run_identity.recorded(older)
    (workdir / run_identity.IDENTITY_FILE).write_text("[]")
    with pytest.raises(UserError, match=f"{workdir / run_identity.IDENTITY_FILE}: not a run identity"):
        run_identity.identity(workdir)


def test_a_marker_from_before_identities_still_reads_and_its_run_is_published_already(tmp_path, capsys):
    workdir = tmp_path / "older"
    (workdir / "export" / "hf").mkdir(parents=True)
    (workdir / "export" / "hf" / "config.json").write_text("{}")
    (workdir / "config.json").write_text("{}")
    old = tmp_path / "published" / "20261201T000000Z-older"  # the name and marker of a version published before
    old.mkdir(parents=True)
    (old / contract.PUBLISHED_MARKER_FILE).write_text(json.dumps({"run": "older", "parts": ["hf"], "step": 3}))
    loop.publish_export(workdir, str(tmp_path / "published"), ("hf",), step=3)
    assert "as 20261201T000000Z-older" in capsys.readouterr().err
    assert contract.published_version_parts(old.name) is None  # its name does not say its parts: its marker does


def test_export_of_a_file_instead_of_a_run_is_one_line(tmp_path, capsys):
    (tmp_path / "notes").write_text("a file")
    assert export_main(["--run", str(tmp_path / "notes"), "--out", str(tmp_path / "hf")]) == contract.USER_ERROR
    assert capsys.readouterr().err == (f"trainer.export: error: --run {tmp_path / 'notes'}: no config.json there; pass "
                                       "the --workdir of a trainer run\n")


def test_the_trainer_refuses_a_publish_dir_under_a_file_before_training(tmp_path, prepared_dir, tokenizer_path):
    (tmp_path / "notes").write_text("a file")
    with pytest.raises(UserError, match="is a file, not a folder"):
        train(tmp_path / "run", prepared_dir, tokenizer_path, "--publish-dir", str(tmp_path / "notes" / "v"))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.fixture(scope="module")
def adapter_run(tmp_path_factory, prepared_dir, tokenizer_path, bucket):
    """A LoRA run that publishes base and adapter to the bucket (as a `lora: adapter` stack tells it),
    then the same run launched again, finished: (workdir, versions after the first launch, after the second)."""
    workdir = tmp_path_factory.mktemp("adapter") / "run-e5f6"
    flags = ["--lora-rank", "4", "--publish-parts", "base,adapter", "--publish-dir", "gs://bucket/published/adapter"]
    train(workdir, prepared_dir, tokenizer_path, *flags)
    first = publish.published_versions("gs://bucket/published/adapter")
    train(workdir, prepared_dir, tokenizer_path, *flags)
    return workdir, first, publish.published_versions("gs://bucket/published/adapter")


def test_an_adapter_run_publishes_its_base_and_adapter_from_the_trainer(adapter_run, bucket):
    workdir, (version,), _ = adapter_run
    prefix = f"/bucket/published/adapter/{version}/"
    marker = json.loads(bucket.store[prefix + contract.PUBLISHED_MARKER_FILE].getvalue())
    assert marker["parts"] == ["adapter", "base"] and marker["step"] == 3 and marker["run"] == run_identity.recorded(workdir)
    assert version.endswith(f"-{marker['run']}.adapter+base")
    names = _objects(bucket, prefix)
    for part, config_file in (("base", "config.json"), ("adapter", "adapter_config.json")):
        assert names[f"{part}/{config_file}"] == (workdir / "export" / part / config_file).read_bytes()
    assert not any(name.startswith("hf/") for name in names)


def test_a_relaunch_that_trains_nothing_publishes_nothing(adapter_run):
    _, first, after_relaunch = adapter_run
    assert after_relaunch == first


def test_publish_parts_of_a_full_fine_tune_is_one_line():
    with pytest.raises(UserError, match="--publish-parts base,adapter: base and adapter are a LoRA run's"):
        parse_config(["--preset", "tiny", "--publish-parts", "base,adapter"])
