"""`python -m trainer.hf.publish --run WORKDIR --publish-dir DIR`: a run's Hugging Face export, published
as a new version that serving follows (docs/serving.md).

A version is PUBLISH_DIR/<UTC stamp>-<run id>/, holding the export's directories (hf/; for a base
with its adapter, base/ and adapter/) and, last, trainer.contract.PUBLISHED_MARKER_FILE. It is copied
under a hidden temporary name, renamed to its own, then marked complete: a reader that goes by the
marker never sees part of a version, and a version is never written over (a new one is added
beside it; rolling back is moving the newest aside). The trainer publishes its final export with
--publish-dir (process 0 only), and `trainer.export --publish DIR` what it writes.
No JAX here.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shutil
import sys

from trainer import contract, shared_files
from trainer.errors import UserError, entry_point

PARTS = ("hf", "base", "adapter")  # merged, or the frozen base and the PEFT adapter (trainer.export --lora-export)


def run_id(workdir: pathlib.Path) -> str:
    """What a version names its run by: the run's directory (workloads: the run object's name)."""
    return workdir.resolve().name


def version_name(run_id: str, now: datetime.datetime) -> str:
    return f"{now.astimezone(datetime.timezone.utc).strftime(contract.PUBLISHED_STAMP_FORMAT)}-{run_id}"


def published_versions(publish_dir: pathlib.Path) -> list[str]:
    """The complete versions in `publish_dir`, oldest first (their names sort by time)."""
    if not publish_dir.is_dir():
        return []
    return sorted(path.name for path in publish_dir.iterdir() if (path / contract.PUBLISHED_MARKER_FILE).is_file())


def publish(publish_dir: pathlib.Path, run_id: str, parts: dict[str, pathlib.Path], *,
            now: datetime.datetime | None = None) -> pathlib.Path:
    """Copies each of `parts` (name in PARTS -> a Hugging Face directory) into a new version of
    `publish_dir` and returns the version's path. Call it from one process only."""
    for name, source in parts.items():
        if not (source / "config.json").is_file() and not (source / "adapter_config.json").is_file():
            raise UserError(f"{source}: no Hugging Face export there (no config.json); nothing to publish as {name}/")
    name = version_name(run_id, now or datetime.datetime.now(datetime.timezone.utc))
    version = publish_dir / name
    if version.exists():
        raise UserError(f"{version}: already published (a version is never written over); publish again in a second")
    temporary = shared_files.temporary_sibling(version)
    try:
        temporary.mkdir(parents=True)
        for part, source in parts.items():
            shutil.copytree(source, temporary / part)
        os.rename(temporary, version)
    finally:
        if temporary.exists():
            shutil.rmtree(temporary)
    marker = {"run": run_id, "parts": sorted(parts), "sources": {part: str(source) for part, source in parts.items()}}
    shared_files.write_text_atomically(version / contract.PUBLISHED_MARKER_FILE, json.dumps(marker, indent=2) + "\n")
    return version


def publish_run(workdir: pathlib.Path, publish_dir: pathlib.Path, parts: tuple[str, ...] = (contract.PUBLISHED_MODEL_DIR,)) -> pathlib.Path:
    """The run's WORKDIR/export/<part> directories as one new version."""
    return publish(publish_dir, run_id(workdir), {part: workdir / "export" / part for part in parts})


def parse_args(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer.hf.publish", description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, type=pathlib.Path, help="the run's --workdir (its export/ holds the directories)")
    parser.add_argument("--publish-dir", required=True, type=pathlib.Path,
                        help="where versions go, e.g. /artifacts/published/RUN_NAME (the serving stack's)")
    parser.add_argument("--part", action="append", choices=PARTS,
                        help="an export directory to publish; give base and adapter for a LoRA adapter's serving (default hf)")
    return parser.parse_args(argv)


@entry_point("trainer.hf.publish: ")
def main(argv=None) -> None:
    args = parse_args(argv)
    version = publish_run(args.run, args.publish_dir, tuple(args.part or (contract.PUBLISHED_MODEL_DIR,)))
    print(f"trainer.hf.publish: published {version}")


if __name__ == "__main__":
    sys.exit(main())
