"""The local tier on GKE's multi-tier checkpointing volume (--multi-tier-backup-minutes).

The volume (CSI driver multitier-checkpoint.csi.storage.gke.io, mounted at --local-checkpoint-dir) is a
RAM disk of the node, outside the pod: it outlives the trainer's processes and its pod. A replicator on
the node (GKE's DaemonSet, not this process) moves each step Orbax completes there into its own store,
copies it to peers and, every --multi-tier-backup-minutes, to the CheckpointConfiguration's bucket. The
protocol is Orbax's (../shared/mtc/orbax-replicator.md, checked against the installed orbax-checkpoint):

  start    `initialize_multi_tier_checkpointing` (instead of jax.distributed.initialize) reads the process
           id and coordinator from <volume>/jax-init-info.txt, writes <volume>/replicator.yaml, waits for
           the replicator to consume it, then for a `*.restore` marker: a symlink that becomes
           <volume>/<step> (the step to resume from) or an empty file (nothing to restore).
  save     `ReplicatorCheckpointManager` writes each process's own shards to <volume>/<step>.
  restore  the step the marker named, into the run's shardings.

What is not the state, the data iterator's position (each process's own), is not on the volume: the
replicator treats peers in other slices as holding the same bytes, which the positions are not. Each
process appends it, one JSON line per saved step, to WORKDIR/multi-tier-data/process-<index>.jsonl
before the step's save (Orbax's persistent_directory for it raced between processes on CPU: a process
wrote into a folder another had already renamed). A save or a restore that fails warns and leaves the
persistent tier (trainer.run.checkpoint) to the run, as the other local tier does.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import time

import jax
from absl import flags
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils
from orbax.checkpoint.experimental.emergency.multi_tier_checkpointing import initialization
from orbax.checkpoint.experimental.emergency.multi_tier_checkpointing import replicator_checkpoint_manager as rcm

from trainer.errors import UserError, first_line
from trainer.run import checkpoint, local_checkpoints, mesh

# The JobSet's name (from its pod annotation): Orbax names the run's backups after it, so that a recreated
# JobSet of the same name finds them.
RUN_NAME_ENV = "JOBSET_NAME"
DATA_POSITIONS_DIR = "multi-tier-data"
# Seconds Orbax waits for the node: jax-init-info.txt (written once every pod of the job has a rank), the
# replicator's answer to replicator.yaml. Its own default; the restore marker has 300 s of its own.
NODE_TIMEOUT_S = 900


def initialize_distributed(config) -> bool:
    """Joins the job: through the volume with --multi-tier-backup-minutes, else mesh.initialize_distributed.
    Returns whether jax.distributed is initialized (the preemption service)."""
    if config.multi_tier_backup_minutes is None:
        return mesh.initialize_distributed(coordinator_address=config.coordinator_address,
                                           num_processes=config.num_processes, process_id=config.process_id)
    volume = config.local_checkpoint_dir
    if any(value is not None for value in (config.coordinator_address, config.num_processes, config.process_id)):
        raise UserError("--coordinator-address, --num-processes and --process-id: with --multi-tier-backup-minutes the "
                        f"process joins the job through {volume}/jax-init-info.txt, which the node writes; remove them")
    run_name = os.environ.get(RUN_NAME_ENV, "").strip()
    if not run_name:
        raise UserError(f"--multi-tier-backup-minutes: environment variable {RUN_NAME_ENV} is not set; it names the run's "
                        "backups (the JobSet's name, from the annotation jobset.sigs.k8s.io/jobset-name)")
    if not (pathlib.Path(volume) / initialization._JAX_INIT_INFO_FILE).exists():  # noqa: SLF001 (Orbax's protocol file)
        local_checkpoints.print_notice(f"waiting up to {NODE_TIMEOUT_S} s for the node's multi-tier checkpointing driver to "
                                       f"write {volume}/jax-init-info.txt (it does once every pod of the job has a rank)")
    # Orbax reads absl flags, which the trainer does not parse: their defaults, and Orbax's process ids
    # those of the rank server (jax-init-info.txt), as MaxText sets it.
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    flags.FLAGS.experimental_orbax_use_distributed_process_id = True
    try:
        initialization.initialize_multi_tier_checkpointing(
            epath.Path(volume), backup_interval_minutes=config.multi_tier_backup_minutes, run_name=run_name,
            num_slices=mesh.num_slices(), jax_initialization_timeout_seconds=NODE_TIMEOUT_S)
    except (TimeoutError, ValueError, RuntimeError, OSError) as error:
        raise UserError(f"--local-checkpoint-dir {volume}: GKE's multi-tier checkpointing did not start ({first_line(error)}); "
                        "is it the pod's volume of driver multitier-checkpoint.csi.storage.gke.io, on a node its "
                        "CheckpointConfiguration selects?") from None
    return True


def open_local_tier(config, abstract_state, device_mesh) -> local_checkpoints.LocalCheckpoints | None:
    """The run's local tier: on the multi-tier volume, in our own format, or None (no --local-checkpoint-dir)."""
    if config.multi_tier_backup_minutes is None:
        return local_checkpoints.open_local(config, abstract_state)
    positions = pathlib.Path(config.workdir) / DATA_POSITIONS_DIR / f"process-{jax.process_index()}.jsonl"
    return ReplicatedCheckpoints(config.local_checkpoint_dir, interval=config.local_checkpoint_interval,
                                 global_mesh=device_mesh, data_positions=positions)


class ReplicatedCheckpoints(local_checkpoints.LocalCheckpoints):
    """The local tier through Orbax's ReplicatorCheckpointManager; the interval (auto or steps), the
    skipped saves of a diverged step and the run's choice between the tiers are LocalCheckpoints'."""

    def __init__(self, directory: str, *, interval: str, global_mesh, data_positions: pathlib.Path,
                 warn=checkpoint.print_warning, say=local_checkpoints.print_notice):
        self.directory = directory
        self.interval = None if interval == "auto" else int(interval)
        self._warn, self._say = warn, say
        self._timing_from = None
        self.save_blocking_s: list[float] = []
        self.restore_s: float | None = None
        self._positions = data_positions
        self._positions.parent.mkdir(parents=True, exist_ok=True)
        self._manager = rcm.ReplicatorCheckpointManager(
            epath.Path(os.path.abspath(directory)), options=rcm.ReplicatorCheckpointManagerOptions(save_interval_steps=1),
            global_mesh=global_mesh)

    def agreed_steps(self) -> list[int]:
        """The step the replicator restored (the same in every process), or none."""
        latest = self._manager.latest_step()
        offered = np.asarray(-1 if latest is None else latest, np.int64)
        steps = {int(step) for step in np.ravel(multihost_utils.process_allgather(offered))} if jax.process_count() > 1 else {int(offered)}
        if len(steps) > 1:
            self._warn(f"--local-checkpoint-dir {self.directory}: the replicator restored different steps to the processes "
                       f"({', '.join(map(str, sorted(steps)))}); resuming from the persistent tier")
            return []
        return [latest] if latest is not None else []

    def save(self, step: int, state, data_iterator) -> float:
        """Orbax copies the shards off the devices and writes them in the background; returns the seconds
        the caller was held (the wait for the previous write included). A failure warns."""
        started = time.perf_counter()
        try:
            with open(self._positions, "a") as positions:
                positions.write(json.dumps({"step": step, "data": data_iterator.get_state()}) + "\n")
                positions.flush()
                os.fsync(positions.fileno())
            self._manager.save(step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(state)), force=True)
        except Exception as error:  # noqa: BLE001 (the run goes on without this step: the persistent tier is saved)
            self._warn(f"--local-checkpoint-dir {self.directory}: saving step {step} failed ({first_line(error)}); "
                       "the persistent tier is unaffected")
        blocked = time.perf_counter() - started
        self.save_blocking_s.append(blocked)
        return blocked

    def restore(self, candidates: list[int], abstract_state, data_iterator) -> tuple[int, object] | None:
        for step in candidates:
            started = time.perf_counter()
            try:
                data_state = self._position(step)
                restored, error = self._manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.PyTreeRestore(item=abstract_state,
                                                 restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_state)))), None
            except Exception as failed:  # noqa: BLE001 (whatever Orbax raises: the persistent tier remains)
                error = failed
            if checkpoint.everywhere(error is None):
                data_iterator.set_state(data_state)
                getattr(data_iterator, "start_prefetch", lambda: None)()
                jax.block_until_ready(restored["state"])
                self.restore_s = time.perf_counter() - started
                return step, restored["state"]
            if error is not None:
                self._warn(f"--local-checkpoint-dir {self.directory}: cannot restore step {step} "
                           f"({type(error).__name__}: {first_line(error)}); the replicator keeps it")
        return None

    def _position(self, step: int):
        """This process's data position at `step`: the last line of that step (a line a kill cut short is
        skipped). KeyError when there is none."""
        found = None
        for line in self._positions.read_text().splitlines() if self._positions.exists() else ():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("step") == step:
                found = record
        if found is None:
            raise KeyError(f"no data position of step {step} in {self._positions}")
        return found["data"]

    def resumed_at(self, step: int) -> None:
        """Removes the volume's steps newer than the one the job resumed from (a restored step is a link into
        the replicator's store, which keeps its files): training saves them again."""
        for newer in [s for s in self._manager.all_steps() if s > step]:
            path = pathlib.Path(self._manager.directory) / str(newer)
            path.unlink() if path.is_symlink() else shutil.rmtree(path, ignore_errors=True)
        self._manager.reload()

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
