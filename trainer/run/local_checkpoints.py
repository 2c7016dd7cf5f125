"""The fast checkpoint tier (--local-checkpoint-dir): each process saves what it holds on its own host.

The persistent tier (trainer.run.checkpoint, Orbax, --checkpoint-dir on a bucket) is saved every
--checkpoint-interval steps; a preemption repeats up to that many steps. This tier is saved more often,
to storage of the host itself (host memory or a local disk), so a restart repeats fewer.

Our own format, not Orbax's `experimental.emergency` manager: that one needs two or more replicas along a
mesh axis and silently drops the local tier otherwise (one slice of FSDP has one replica), its behaviour
on CPU is unconfirmed, and it does not carry the grain data iterator's position, without which a resumed
run trains on other batches.

Layout: LOCAL_DIR/process-<process index>/<step>/ holds
  shards.bin  this process's addressable shards of the train state, one copy of each distinct index
  data.json   this process's data iterator state (grain get_state(); as grain.checkpoint.CheckpointSave)
  meta.json   written last: the run identity, and for every shard its leaf, index (slice of the global
              array), shape, dtype, offset, length and CRC-32
A step is written under `.partial-<step>-<identity>-<token>` and renamed to `<step>` once meta.json is
in it: a save killed mid-way leaves a temporary, never a step. Temporaries are ignored; a process removes
only its own run's (the identity in the name) of an older step than one it has just completed.

The run identity is a digest of the persistent checkpoint directory, the process count and the state's
layout (every leaf's path, shape, dtype and which device holds which slice). A step of another identity
(another run, another --mesh, another process count) is never restored: it is moved into quarantine/
with one warning, never deleted.

Restore: every process lists the complete steps of its own run in its own directory; the job agrees
(process_allgather) on the newest step every process holds, and restores it when it is at least as new
as the persistent tier's newest. A process whose local tier is gone (a replaced host) makes the step
incomplete: the job falls back to the newest step complete everywhere, else to the persistent tier.
There is no peer-to-peer copy of a missing process's shards. A step that does not read is moved into
quarantine/ (never deleted) and the next candidate is tried.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import pathlib
import shutil
import sys
import threading
import time
import uuid
import zlib

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from trainer import contract
from trainer.errors import UserError, first_line
from trainer.run import checkpoint

SHARDS, DATA, META = "shards.bin", "data.json", "meta.json"
FORMAT = 1
TEMPORARY_PREFIX = ".partial-"
QUARANTINE_DIR = "quarantine"
KEEP = contract.LOCAL_CHECKPOINTS_KEPT
# How many of its newest steps each process offers when the job agrees on one to restore.
OFFERED_STEPS = 8
# --local-checkpoint-interval auto: the share of the step time saving may cost, and the steps timed
# (after the run's first) before the first save measures its cost.
AUTO_BUDGET = 0.02
AUTO_TIMED_STEPS = 3


def print_notice(message: str) -> None:
    print(f"trainer: {message}", file=sys.stderr, flush=True)


def run_identity(abstract_state, *, run: str) -> str:
    """A digest of what makes a local step restorable into this run: `run` (the persistent checkpoint
    directory, which names the run), the process count, and for every leaf of the state its path,
    shape, dtype and the slice each device holds."""
    digest = hashlib.sha256(json.dumps({"format": FORMAT, "run": run, "processes": jax.process_count()}).encode())
    for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_state)[0]:
        layout = sorted((device.id, _index(index, leaf.shape)) for device, index in leaf.sharding.devices_indices_map(leaf.shape).items())
        digest.update(json.dumps([jax.tree_util.keystr(path), list(leaf.shape), jnp.dtype(leaf.dtype).name, layout]).encode())
    return digest.hexdigest()[:16]


def _index(index: tuple, shape: tuple) -> tuple:
    """A shard's index (slices, some open) as ((start, stop), ...) per axis."""
    return tuple(tuple(axis.indices(size)[:2]) for axis, size in zip(index, shape))


@dataclasses.dataclass(frozen=True)
class Resumed:
    tier: str  # "local" or "persistent"
    step: int
    directory: str
    state: object


class LocalCheckpoints:
    """This process's part of the local tier: saves (the file writes in a background thread), the job's
    agreement on a step to restore, and that step's restore."""

    def __init__(self, directory: str, *, identity: str, interval: str = "auto", keep: int = KEEP,
                 warn=checkpoint.print_warning, say=print_notice):
        self.directory = directory
        self.identity = identity
        self.interval = None if interval == "auto" else int(interval)  # None: chosen at the first save
        self.keep = keep
        self.folder = pathlib.Path(os.path.abspath(directory)) / f"process-{jax.process_index()}"
        self._warn, self._say = warn, say
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UserError(f"--local-checkpoint-dir {directory}: cannot use it ({error.strerror}); choose a directory "
                            "on this host that the job can write") from None
        self._steps: list[int] = []  # this run's complete steps here, oldest first
        self._writer: threading.Thread | None = None
        self._timing_from: tuple[int, float] | None = None  # (step, time) the auto interval's step timing began
        self.save_blocking_s: list[float] = []  # what each save cost the step loop
        self.restore_s: float | None = None

    # Listing and agreement.

    def complete_steps(self) -> list[int]:
        """This run's complete steps in this process's folder, oldest first. A step of another run or
        layout, or whose meta.json does not read, is moved into quarantine/ with one warning."""
        steps, others = [], []
        for entry in self.folder.iterdir():
            if not entry.name.isdigit() or not entry.is_dir():
                continue  # temporaries, quarantine/
            try:
                identity = json.loads((entry / META).read_text())["identity"]
            except (OSError, ValueError, KeyError, TypeError) as error:
                place = self._quarantine(int(entry.name), "unreadable-meta")
                self._warn(f"--local-checkpoint-dir {self.directory}: step {entry.name} of process {jax.process_index()} "
                           f"is not complete ({first_line(error)}); moved it to {place}")
                continue
            (steps if identity == self.identity else others).append(int(entry.name))
        if others:
            places = [self._quarantine(step, "another-run") for step in sorted(others)]
            self._warn(f"--local-checkpoint-dir {self.directory}: steps {', '.join(map(str, sorted(others)))} of process "
                       f"{jax.process_index()} are of another run or layout (another --checkpoint-dir, --mesh, model or "
                       f"process count); not restored, moved to {places[0].parent}")
        self._steps = sorted(steps)
        return list(self._steps)

    def agreed_steps(self) -> list[int]:
        """The steps complete in every process's local tier, newest first (the same list everywhere)."""
        offered = np.full(OFFERED_STEPS, -1, np.int64)
        newest = self.complete_steps()[-OFFERED_STEPS:]
        offered[: len(newest)] = newest
        if jax.process_count() == 1:
            everywhere = set(newest)
        else:
            gathered = np.asarray(multihost_utils.process_allgather(offered)).reshape(jax.process_count(), -1)
            everywhere = set.intersection(*(set(int(step) for step in row if step >= 0) for row in gathered))
        return sorted(everywhere, reverse=True)

    # Saving.

    def due(self, step: int) -> bool:
        """Whether after_step(step) may save (with auto, every step until the interval is chosen)."""
        return self.interval is None or step % self.interval == 0

    def after_step(self, step: int, state, data_iterator, metrics=None) -> None:
        """Called by the step loop after every step: saves when `step` is due, unless a value of the
        step's `metrics` is not finite (a diverged state is never the one a restart resumes from)."""
        if not self.due(step) or (metrics is not None and not all(np.isfinite(v) for v in jax.device_get(metrics).values())):
            return
        if self.interval is None:
            self._choose_interval(step, state, data_iterator)
        else:
            self.save(step, state, data_iterator)

    def _choose_interval(self, step: int, state, data_iterator) -> None:
        """auto: times AUTO_TIMED_STEPS steps after the run's first (which warms up), saves, and picks
        the interval that keeps the save's blocking cost under AUTO_BUDGET of the step time. Every
        process measures; the job takes the longest interval, so they all save the same steps."""
        if self._timing_from is None or step < self._timing_from[0] + AUTO_TIMED_STEPS:
            if self._timing_from is None:
                jax.block_until_ready(state)
                self._timing_from = (step, time.perf_counter())
            return
        jax.block_until_ready(state)
        step_s = (time.perf_counter() - self._timing_from[1]) / (step - self._timing_from[0])
        save_s = self.save(step, state, data_iterator)
        interval = max(1, math.ceil(round(save_s / (AUTO_BUDGET * step_s), 6)))  # 25.000000000000004 is 25
        if jax.process_count() > 1:
            interval = int(np.max(multihost_utils.process_allgather(np.asarray(interval, np.int64))))
        self.interval = interval
        if jax.process_index() == 0:
            self._say(f"--local-checkpoint-interval auto: every {interval} steps: a local save blocked the step loop "
                      f"{save_s * 1e3:.1f} ms, a step takes {step_s * 1e3:.1f} ms, and saving may cost "
                      f"{AUTO_BUDGET:.0%} of the step time (interval = ceil({save_s * 1e3:.1f} / "
                      f"({AUTO_BUDGET:g} x {step_s * 1e3:.1f})), at least 1)")

    def save(self, step: int, state, data_iterator) -> float:
        """Copies this process's shards to host memory and has a background thread write them; returns
        the seconds the caller was held (the wait for the previous write included)."""
        started = time.perf_counter()
        self.wait()
        data_state = data_iterator.get_state()
        entries, arrays = [], []
        for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
            held = set()
            for shard in leaf.addressable_shards:
                index = _index(shard.index, leaf.shape)
                if index not in held:  # a replicated slice once
                    held.add(index)
                    entries.append({"leaf": jax.tree_util.keystr(path), "index": index})
                    arrays.append(shard.data)
        host = jax.device_get(arrays)
        # On CPU a fetched array can share the device buffer, which the next step's donation reuses.
        host = [np.array(array) if next(iter(data.devices())).platform == "cpu" else np.asarray(array)
                for array, data in zip(host, arrays)]
        self._writer = threading.Thread(target=self._write, args=(step, entries, host, data_state),
                                        name=f"local checkpoint {step}", daemon=True)
        self._writer.start()
        blocked = time.perf_counter() - started
        self.save_blocking_s.append(blocked)
        return blocked

    def _write(self, step: int, entries: list[dict], arrays: list[np.ndarray], data_state) -> None:
        """Writes the step under a temporary name and renames it into place; a failure warns (the
        persistent tier is still saved) and leaves no step."""
        temporary = self.folder / f"{TEMPORARY_PREFIX}{step}-{self.identity}-{uuid.uuid4().hex[:8]}"
        try:
            temporary.mkdir()
            offset = 0
            with open(temporary / SHARDS, "wb") as out:
                for entry, array in zip(entries, arrays):
                    data = memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
                    out.write(data)
                    entry.update(shape=list(array.shape), dtype=array.dtype.name, offset=offset, length=data.nbytes,
                                 crc32=zlib.crc32(data))
                    offset += data.nbytes
                out.flush()
                os.fsync(out.fileno())
            (temporary / DATA).write_text(json.dumps(data_state))
            meta = {"format": FORMAT, "identity": self.identity, "step": step, "process_index": jax.process_index(),
                    "process_count": jax.process_count(), "data_crc32": zlib.crc32((temporary / DATA).read_bytes()),
                    "shards": entries}
            with open(temporary / META, "w") as out:  # the completeness marker: written last
                out.write(json.dumps(meta))
                out.flush()
                os.fsync(out.fileno())
            final = self.folder / str(step)
            if final.exists():  # this run's own step of an earlier attempt (agreement dropped it)
                shutil.rmtree(final)
            os.rename(temporary, final)
        except Exception as error:  # noqa: BLE001 (a full disk, or anything else: the run goes on without this step)
            shutil.rmtree(temporary, ignore_errors=True)
            self._warn(f"--local-checkpoint-dir {self.directory}: saving step {step} failed ({first_line(error)}); "
                       "the persistent tier is unaffected")
            return
        self._steps = sorted({*self._steps, step})
        for old in self._steps[: -self.keep]:
            shutil.rmtree(self.folder / str(old), ignore_errors=True)
        self._steps = self._steps[-self.keep:]
        for leftover in self.folder.glob(f"{TEMPORARY_PREFIX}*-{self.identity}-*"):
            left_step = leftover.name[len(TEMPORARY_PREFIX):].split("-")[0]
            if left_step.isdigit() and int(left_step) < step:  # ours, and a newer step is complete
                shutil.rmtree(leftover, ignore_errors=True)

    def wait(self) -> None:
        if self._writer is not None:
            self._writer.join()
            self._writer = None

    def close(self) -> None:
        self.wait()

    # Restoring.

    def read(self, step: int, abstract_state) -> tuple[object, object]:
        """(state, data iterator state) of this process's copy of `step`, laid out like `abstract_state`.
        Raises ValueError, KeyError or OSError when it does not match or does not read."""
        folder = self.folder / str(step)
        meta = json.loads((folder / META).read_text())
        if meta.get("format") != FORMAT or meta.get("identity") != self.identity:
            raise ValueError(f"step {step} is of another run or layout")
        data_bytes = (folder / DATA).read_bytes()
        if zlib.crc32(data_bytes) != meta["data_crc32"]:
            raise ValueError(f"{DATA} does not match its checksum")
        saved: dict[str, dict[tuple, dict]] = {}
        for entry in meta["shards"]:
            saved.setdefault(entry["leaf"], {})[tuple(tuple(axis) for axis in entry["index"])] = entry
        leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract_state)
        restored = []
        with open(folder / SHARDS, "rb") as shards:
            for path, leaf in leaves:
                key = jax.tree_util.keystr(path)
                wanted = {device: _index(index, leaf.shape)
                          for device, index in leaf.sharding.addressable_devices_indices_map(leaf.shape).items()}
                if set(wanted.values()) != set(saved.get(key, {})):
                    raise ValueError(f"{key}: the saved slices are not those this process holds")
                host = {index: _read_shard(shards, entry, leaf.dtype) for index, entry in saved[key].items()}
                singles = [jax.device_put(host[index], device) for device, index in wanted.items()]
                restored.append(jax.make_array_from_single_device_arrays(leaf.shape, leaf.sharding, singles))
        return jax.tree_util.tree_unflatten(treedef, restored), json.loads(data_bytes)

    def restore(self, candidates: list[int], abstract_state, data_iterator) -> tuple[int, object] | None:
        """Restores the newest of `candidates` (steps complete everywhere, newest first) that reads in
        every process; this process's copy of one that does not read here is moved into quarantine/.
        None when none reads everywhere."""
        for step in candidates:
            started = time.perf_counter()
            try:
                (state, data_state), error = self.read(step, abstract_state), None
            except (ValueError, KeyError, TypeError, OSError) as failed:
                error = failed
            if checkpoint.everywhere(error is None):
                data_iterator.set_state(data_state)
                getattr(data_iterator, "start_prefetch", lambda: None)()
                jax.block_until_ready(state)
                self.restore_s = time.perf_counter() - started
                return step, state
            if error is not None:
                reason = type(error).__name__
                place = self._quarantine(step, reason)
                self._warn(f"--local-checkpoint-dir {self.directory}: cannot restore step {step} of process "
                           f"{jax.process_index()} ({reason}: {first_line(error)}); moved it to {place}")
            # else: it read here but not in another process; it stays, no longer a candidate.
        return None

    def resumed_at(self, step: int) -> None:
        """Removes this run's local steps newer than the step the job resumed from (steps an earlier
        attempt saved that not every process held): training writes them again."""
        self.complete_steps()
        for newer in [s for s in self._steps if s > step]:
            shutil.rmtree(self.folder / str(newer), ignore_errors=True)
        self._steps = [s for s in self._steps if s <= step]

    def _quarantine(self, step: int, reason: str) -> pathlib.Path:
        """Moves the step's folder, bytes as they are, to quarantine/<step>-<reason>[-n]; never deleted."""
        quarantine = self.folder / QUARANTINE_DIR
        quarantine.mkdir(exist_ok=True)
        place, copy = quarantine / f"{step}-{reason}", 1
        while place.exists():
            copy += 1
            place = quarantine / f"{step}-{reason}-{copy}"
        os.rename(self.folder / str(step), place)
        self._steps = [s for s in self._steps if s != step]
        return place


def _read_shard(shards, entry: dict, dtype) -> np.ndarray:
    if jnp.dtype(entry["dtype"]) != jnp.dtype(dtype) or tuple(entry["shape"]) != tuple(b - a for a, b in entry["index"]):
        raise ValueError(f"{entry['leaf']}: a saved slice is {entry['dtype']}{entry['shape']}, not what the state needs")
    shards.seek(entry["offset"])
    data = shards.read(entry["length"])
    if len(data) != entry["length"] or zlib.crc32(data) != entry["crc32"]:
        raise ValueError(f"{entry['leaf']}: {SHARDS} is damaged (short or not matching its checksum)")
    return np.frombuffer(data, jnp.dtype(entry["dtype"])).reshape(entry["shape"])


def open_local(config, abstract_state, *, warn=checkpoint.print_warning) -> LocalCheckpoints | None:
    """The run's local tier, or None without --local-checkpoint-dir. `config` is the TrainConfig."""
    if config.local_checkpoint_dir is None:
        return None
    persistent = config.resolved_checkpoint_dir
    identity = run_identity(abstract_state, run=persistent if "://" in persistent else os.path.abspath(persistent))
    return LocalCheckpoints(config.local_checkpoint_dir, identity=identity, interval=config.local_checkpoint_interval,
                            warn=warn)


class Tiers:
    """The two tiers at a run's start: which step it resumes from, and that step's restore."""

    def __init__(self, persistent: checkpoint.Checkpointer, local: LocalCheckpoints | None):
        self.persistent, self.local = persistent, local
        self.persistent_step = persistent.latest_step()
        self.local_candidates = local.agreed_steps() if local is not None else []  # collective: every process calls

    def newest_step(self) -> int | None:
        """The step a restart resumes from (None: a fresh start), before any read is tried."""
        steps = [step for step in (self.persistent_step, *self.local_candidates[:1]) if step is not None]
        return max(steps) if steps else None

    def restore(self, abstract_state, data_iterator) -> Resumed:
        """The local tier's newest step complete everywhere when it is at least as new as the persistent
        tier's newest, and reads; otherwise the persistent tier (Checkpointer.restore_latest)."""
        floor = -1 if self.persistent_step is None else self.persistent_step
        candidates = [step for step in self.local_candidates if step >= floor]
        restored = self.local.restore(candidates, abstract_state, data_iterator) if candidates else None
        if restored is not None:
            resumed = Resumed("local", restored[0], self.local.directory, restored[1])
        elif self.persistent_step is not None:
            step, state = self.persistent.restore_latest(abstract_state, data_iterator)
            resumed = Resumed("persistent", step, self.persistent.directory, state)
        else:
            raise UserError(f"--local-checkpoint-dir {self.local.directory}: no local step restores (they were moved to "
                            f"its process-<index>/{QUARANTINE_DIR}) and --checkpoint-dir {self.persistent.directory} "
                            "holds none; move them back after fixing the cause, or restart to train from the start")
        if self.local is not None:
            self.local.resumed_at(resumed.step)
        return resumed
