"""Who a run is: the name its published versions, their markers and its goodput events carry.

`<the workdir's folder name>-<8 hex>`, the hex a digest of the run's resolved workdir (as a URL) and its
options: two runs in folders of one name (a/train and b/train) publishing to one folder are two runs, and
the name still says which folder. Process 0 records it in WORKDIR/IDENTITY_FILE at the run's first start;
every later start, `trainer.export` and `trainer.hf.publish` read it back, so a restart or a longer --steps
keeps it. A run that began before identities were recorded (its config.json is there, no identity file)
keeps its folder's name, the one its versions already carry.
"""

from __future__ import annotations

import hashlib
import json
import pathlib

from trainer import shared_files
from trainer.errors import UserError

IDENTITY_FILE = "run_identity.json"
_CONFIG_FILE = "config.json"  # written by every run since the first trainer: a run from before identities has it


def new_identity(workdir: pathlib.Path, options: dict) -> str:
    folder = pathlib.Path(workdir).resolve()
    digest = hashlib.sha256(json.dumps({"workdir": folder.as_uri(), "options": options}, sort_keys=True, default=str).encode())
    return f"{folder.name}-{digest.hexdigest()[:8]}"


def recorded(workdir) -> str | None:
    """The identity recorded in `workdir` (a pathlib or etils.epath Path), None when there is none; a file
    that does not say one is one line (UserError)."""
    path = workdir / IDENTITY_FILE
    if not path.exists():
        return None
    try:
        identity = json.loads(path.read_text()).get("run")
    except (ValueError, AttributeError):
        identity = None
    if not isinstance(identity, str) or not identity:
        raise UserError(f"{path}: not a run identity (a JSON object with \"run\"); move it aside and the run records a new one")
    return identity


def identity(workdir: pathlib.Path) -> str:
    """The run's identity: the recorded one, else (a run from before identities) its folder's name."""
    return recorded(workdir) or pathlib.Path(workdir).resolve().name


def record(workdir: pathlib.Path, options: dict) -> str:
    """The run's identity, recorded at its first start (process 0 only)."""
    found = recorded(workdir)
    if found is not None:
        return found
    folder = pathlib.Path(workdir).resolve()
    run = folder.name if (workdir / _CONFIG_FILE).exists() else new_identity(workdir, options)
    text = json.dumps({"run": run, "workdir": folder.as_uri()}, indent=2) + "\n"
    shared_files.write_text_atomically(workdir / IDENTITY_FILE, text)
    return run
