"""`python -m tests.trainer.replicator_stand_in ROOT NODES`: GKE's multi-tier checkpointing node side, for tests.

One process stands in for every node's driver and replicator (GKE runs them as a DaemonSet): ROOT/node-<i>
is node i's RAM disk, the trainer's --local-checkpoint-dir on it. It outlives the trainer's processes, as
the node's volume outlives its pods. The file protocol is Orbax's (../shared/mtc/orbax-replicator.md,
orbax initialization.py): one start of the stand-in serves one attempt of the job (a pod recreation
starts the node's replicator again, on a new replicator.yaml).

  1. writes node-<i>/jax-init-info.txt: "<i>\\n127.0.0.1:<a free port>\\n" (the rank server's answer);
  2. consumes each node's replicator.yaml (reads, then deletes it) and removes from the volume what is
     not the replicator's (every name but *.meta, *.data, jax-init-info.txt, replicator.yaml);
  3. once every node's has come: the newest step whose .meta every node holds is restored, as a
     symlink {job}-s{step}-n{i}-w0.restore -> its .data folder; none: an empty {job}-s0-n{i}-w0.restore;
  4. then, until SIGTERM: each step folder Orbax has committed (node-<i>/<digits>, a real folder) is renamed
     to {job}-s{step}-n{i}.data with a .meta beside it, keeping the newest KEPT of them.

It copies nothing between nodes and backs nothing up: a node whose files are gone makes its steps
unrestorable, and the job starts from the persistent tier. Each action is one line on stdout.
"""

import json
import os
import pathlib
import re
import shutil
import signal
import socket
import sys
import time

import yaml

KEPT = 2
POLL_S = 0.05
KEEP_NAMES = ("jax-init-info.txt", "replicator.yaml")
STEP_DIR = re.compile(r"^[0-9]+$")
META = re.compile(r"^(?P<job>.+)-s(?P<step>[0-9]+)-n(?P<node>[0-9]+)-w0\.meta$")


def say(line: str) -> None:
    print(f"stand-in: {line}", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_atomically(path: pathlib.Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def committed(step: pathlib.Path) -> bool:
    """Whether Orbax is done with a step folder: its metadata has the commit time, which Orbax writes
    after renaming the folder into place (taking the folder earlier fails Orbax's write)."""
    try:
        return "commit_timestamp_nsecs" in json.loads((step / "_CHECKPOINT_METADATA").read_text())
    except (OSError, ValueError):
        return False


class Node:
    def __init__(self, root: pathlib.Path, index: int):
        self.index, self.volume = index, root / f"node-{index}"
        self.volume.mkdir(parents=True, exist_ok=True)
        self.job: str | None = None

    def stored_steps(self) -> set[int]:
        return {int(match["step"]) for path in self.volume.glob("*.meta") if (match := META.match(path.name))}

    def consume_replicator_file(self) -> bool:
        """Step 2: whether this node's replicator.yaml came (and is now consumed)."""
        path = self.volume / "replicator.yaml"
        if not path.exists():
            return False
        config = yaml.safe_load(path.read_text())
        path.unlink()
        self.job = config["job-name"]
        say(f"node {self.index}: replicator.yaml consumed (node-rank {config['node-rank']}, nodes {config['nodes']}, "
            f"backup every {config['backup-interval-minutes']} min)")
        for entry in self.volume.iterdir():
            if entry.name not in KEEP_NAMES and not entry.name.endswith((".meta", ".data")):
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        return True

    def mark_restore(self, step: int | None) -> None:
        """Step 3: the marker Orbax waits for."""
        if step is None:
            (self.volume / f"{self.job}-s0-n{self.index}-w0.restore").touch()
            say(f"node {self.index}: nothing to restore")
            return
        data = self.volume / f"{self.job}-s{step}-n{self.index}.data"
        (self.volume / f"{self.job}-s{step}-n{self.index}-w0.restore").symlink_to(data)
        say(f"node {self.index}: restore step {step}")

    def take_new_steps(self) -> None:
        """Step 4: completed steps into the store, the oldest beyond KEPT removed."""
        for entry in sorted(self.volume.iterdir()):
            if STEP_DIR.match(entry.name) and entry.is_dir() and not entry.is_symlink() and committed(entry):
                data = self.volume / f"{self.job}-s{entry.name}-n{self.index}.data"
                shutil.rmtree(data, ignore_errors=True)  # a step trained again after a restore from an older one
                os.rename(entry, data)
                write_atomically(self.volume / f"{self.job}-s{entry.name}-n{self.index}-w0.meta", data.name)
                say(f"node {self.index}: stored step {entry.name}")
        for old in sorted(self.stored_steps())[:-KEPT]:
            (self.volume / f"{self.job}-s{old}-n{self.index}-w0.meta").unlink()
            shutil.rmtree(self.volume / f"{self.job}-s{old}-n{self.index}.data", ignore_errors=True)


def serve(root: pathlib.Path, count: int) -> None:
    nodes = [Node(root, index) for index in range(count)]
    port = free_port()
    for node in nodes:
        write_atomically(node.volume / "jax-init-info.txt", f"{node.index}\n127.0.0.1:{port}\n")
    say(f"{count} nodes, coordinator 127.0.0.1:{port}")
    waiting = set(range(count))
    while waiting:
        waiting -= {node.index for node in nodes if node.index in waiting and node.consume_replicator_file()}
        time.sleep(POLL_S)
    everywhere = set.intersection(*(node.stored_steps() for node in nodes))
    for node in nodes:
        node.mark_restore(max(everywhere) if everywhere else None)
    while True:
        for node in nodes:
            node.take_new_steps()
        time.sleep(POLL_S)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(pathlib.Path(sys.argv[1]), int(sys.argv[2]))
