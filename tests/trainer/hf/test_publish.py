"""Publishing an export for serving: the trainer's final export and `trainer.export --publish` add a
version beside the earlier ones, never over one, and a version without its marker (one being
copied, or a copy that died) is not one."""

import datetime
import json
import pathlib

import pytest

from tests.trainer.hf.test_export import train
from trainer import contract
from trainer.hf import publish
from trainer.export import main as export_main
from trainer.hf.publish import main as publish_main
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
    assert version.endswith("-run-a1b2")
    copied = published / version / contract.PUBLISHED_MODEL_DIR
    assert sorted(path.name for path in copied.iterdir()) == sorted(path.name for path in (workdir / "export" / "hf").iterdir())
    assert json.loads((published / version / contract.PUBLISHED_MARKER_FILE).read_text())["run"] == "run-a1b2"


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
    assert version.name == "20261205T120000Z-run"


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
