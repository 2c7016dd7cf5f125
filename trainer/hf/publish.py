"""`python -m trainer.hf.publish --run WORKDIR --publish-dir DIR`: a run's Hugging Face export, published
as a new version that serving follows (docs/serving.md).

A version is PUBLISH_DIR/<UTC stamp>-<run identity>.<parts>/ (trainer.contract.published_version_name;
the identity is trainer.run_identity's), holding the export's directories (hf/; for a base with its
adapter, base/ and adapter/) and, last, trainer.contract.PUBLISHED_MARKER_FILE, which names the run and
them. PUBLISH_DIR is a local folder or gs://BUCKET/PATH, written through etils.epath as checkpoints
are (a bucket has no folder to rename into place, so the files go to the version's own name): a
reader that goes by the marker never sees part of a version, and a version is never written over (a
new one is added beside it; rolling back is moving the newest aside). The trainer publishes its final
export with --publish-dir (process 0 only), and `trainer.export --publish DIR` what it writes.
No JAX here.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import shutil
import sys

from etils import epath

from trainer import contract, run_identity, shared_files, storage
from trainer.errors import OneLineParser, UserError, entry_point

_COPY_CHUNK = 16 * 2**20


def published_versions(publish_dir) -> list[str]:
    """The complete versions in `publish_dir`, oldest first (their names sort by time)."""
    root = epath.Path(publish_dir)
    if not root.is_dir():
        return []
    return sorted(path.name for path in root.iterdir() if (path / contract.PUBLISHED_MARKER_FILE).is_file())


def published_step(publish_dir, run: str, step: int, parts, *, warn=None) -> str | None:
    """The newest complete version of run `run` (its identity) at training step `step` that holds `parts`, or
    None; a marker that is not one is passed over, `warn` saying so once (trainer.contract.published_marker)."""
    for name in reversed(published_versions(publish_dir)):
        path = epath.Path(publish_dir) / name / contract.PUBLISHED_MARKER_FILE
        marker = contract.published_marker(path.read_text(), source=str(path), warn=warn)
        if (marker is not None and marker["run"] == run and marker.get("step") == step
                and contract.holds_parts(marker["parts"], parts)):
            return name
    return None


def check_publish_dir(publish_dir, *, flag: str = "--publish-dir") -> None:
    """Refuses, in one line and before any work, an empty `flag` (it would publish into the current folder), a
    gs:// one that storage cannot serve and a local one that cannot be a folder (trainer.storage)."""
    storage.check_folder(flag, publish_dir, to="publish versions in")


def _copy_tree(source: pathlib.Path, target: epath.Path) -> None:
    for path in sorted(source.rglob("*")):
        if path.is_file():
            destination = target / path.relative_to(source).as_posix()
            destination.parent.mkdir(parents=True, exist_ok=True)
            with path.open("rb") as reader, destination.open("wb") as writer:
                shutil.copyfileobj(reader, writer, _COPY_CHUNK)


def _write_marker(version: epath.Path, text: str) -> None:
    """The marker, whole: a bucket's object appears whole once written; a local file is renamed into place."""
    if "://" in str(version):
        (version / contract.PUBLISHED_MARKER_FILE).write_text(text)
    else:
        shared_files.write_text_atomically(pathlib.Path(version) / contract.PUBLISHED_MARKER_FILE, text)


def publish(publish_dir, run: str, parts: dict[str, pathlib.Path], *, now: datetime.datetime | None = None,
            step: int | None = None) -> epath.Path:
    """Copies each of `parts` (name in contract.PUBLISHED_PARTS -> a Hugging Face directory) into a new
    version of `publish_dir` for run `run` (its identity), then writes its marker, and returns the version's
    path. `step`: the training step the weights are of, when known. Call it from one process only."""
    for name, source in parts.items():
        if not (source / "config.json").is_file() and not (source / "adapter_config.json").is_file():
            raise UserError(f"{source}: no Hugging Face export there (no config.json); nothing to publish as {name}/")
    check_publish_dir(publish_dir)
    version = epath.Path(publish_dir) / contract.published_version_name(run, parts, now or datetime.datetime.now(datetime.timezone.utc))
    if version.exists():
        raise UserError(f"{version}: already published (a version is never written over); publish again in a second")
    marker = {"run": run, "parts": sorted(parts), "sources": {part: str(source) for part, source in parts.items()},
              **({"step": step} if step is not None else {})}
    try:
        for part, source in parts.items():
            _copy_tree(source, version / part)
        _write_marker(version, json.dumps(marker, indent=2) + "\n")  # last
    except OSError as error:
        if version.exists():
            version.rmtree()  # this call's own files: the version was not there before
        raise UserError(f"--publish-dir {publish_dir}: writing {version} failed ({error}); nothing was published") from None
    return version


def publish_run(workdir: pathlib.Path, publish_dir, parts: tuple[str, ...] = (contract.PUBLISHED_MODEL_DIR,), *,
                step: int | None = None) -> epath.Path:
    """The run's WORKDIR/export/<part> directories as one new version."""
    return publish(publish_dir, run_identity.identity(workdir), {part: workdir / "export" / part for part in parts}, step=step)


def parse_args(argv) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m trainer.hf.publish", description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, type=pathlib.Path, help="the run's --workdir (its export/ holds the directories)")
    parser.add_argument("--publish-dir", required=True,
                        help="where versions go, a folder or gs://BUCKET/published/RUN_NAME (the serving stack's)")
    parser.add_argument("--part", action="append", choices=contract.PUBLISHED_PARTS,
                        help="an export directory to publish; give base and adapter for a LoRA adapter's serving (default hf)")
    return parser.parse_args(argv)


@entry_point("trainer.hf.publish: ")
def main(argv=None) -> None:
    args = parse_args(argv)
    version = publish_run(args.run, args.publish_dir, tuple(args.part or (contract.PUBLISHED_MODEL_DIR,)))
    print(f"trainer.hf.publish: published {version}")


if __name__ == "__main__":
    sys.exit(main())
