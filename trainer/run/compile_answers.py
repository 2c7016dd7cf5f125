"""Every compile of the trainer's programs goes through `compile`: in the trainer it is the compiler's
executable; inside `session` (what `python -m workloads fit` opens) it is the compiler's answers only
(memory analysis, cost analysis, the optimized program's text, or its memory refusal), printed as
progress on stderr and kept on disk, so that a second `fit` of an unchanged run compiles nothing.

JAX's own persistent compilation cache cannot serve here: it stores executables, and one compiled for
a topology (no TPU attached) is written but cannot be read back ("PjRtCompiler must be constructed
with a Client to call DeserializeLoadedExecutable", docs/fit.md). The answers are keyed by what makes
the compiler answer differently: the lowered program's text, jaxlib and libtpu versions, XLA_FLAGS,
LIBTPU_INIT_ARGS and the compile's options, and the devices (kind, ids, coordinates, slices).

A TPU compile takes its generation's XLA flags (trainer.run.tpu_flags) as compile options unless
LIBTPU_INIT_ARGS is set (the pods set it; a user's own wins): libtpu reads that variable once a process,
and `fit` compiles for more than one generation in one (v5e's continuation fusion makes a v6e compile fail).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import importlib.metadata
import json
import os
import pathlib
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterator
from typing import TextIO

import jax
from etils import epath

from trainer import shared_files, storage
from trainer.run import hardware, tpu_flags

_ACCELERATOR_OF_DEVICE_KIND = {kind: accelerator for accelerator, kind in hardware.DEVICE_KIND_OF_ACCELERATOR.items()}


REFUSALS = "refusals"  # the folder of the compilation cache that keeps memory refusals (_executable)
ESTIMATES = "estimates"  # the folder that keeps --remat auto's speed estimates (kept_figures)
_kept = None  # the compilation cache's folder (epath.Path), once use_persistent_cache is called
_HIT = "/jax/compilation_cache/cache_hits"
_WRITE = "/jax/compilation_cache/cache_misses"  # JAX's name for an entry it writes after compiling
_SAVED = "/jax/compilation_cache/compile_time_saved_sec"
_COMPILE = "/jax/core/compile/backend_compile_duration"  # every compile request, read back or compiled


@dataclasses.dataclass
class PersistentCache:
    """A run's use of JAX's persistent compilation cache (`--compilation-cache-dir`): programs read back from it
    (`hits`, the compile seconds that saved), programs compiled ((name, seconds) each: a second start of the same
    run should have none) and entries written, from JAX's own monitoring events. A compile request records its
    hit (if any) and then its duration in the thread that asked, so a request's duration after a hit in its
    thread is a read back, any other a compile."""

    path: str
    hits: int = 0
    writes: int = 0
    saved_s: float = 0.0
    compiled: list[tuple[str, float]] = dataclasses.field(default_factory=list)
    _read_back: set[int] = dataclasses.field(default_factory=set)

    def _event(self, event: str, **_) -> None:
        if event == _HIT:
            self.hits += 1
            self._read_back.add(threading.get_ident())
        elif event == _WRITE:
            self.writes += 1

    def _duration(self, event: str, seconds: float, fun_name: str = "?", **_) -> None:
        if event == _SAVED:
            self.saved_s += seconds
        elif event == _COMPILE:
            if threading.get_ident() in self._read_back:
                self._read_back.discard(threading.get_ident())
            else:
                self.compiled.append((fun_name, seconds))

    def line(self) -> str:
        longest = sorted(self.compiled, key=lambda entry: -entry[1])[:3]
        named = "".join(f", {name} {seconds:.1f} s" for name, seconds in longest)
        saved = max(self.saved_s, 0.0)  # below zero where reading a program back took longer than compiling it
        return (f"compilation cache {self.path}: {self.hits} programs read back (about {saved:.0f} s of compiling "
                f"saved), {len(self.compiled)} compiled ({sum(seconds for _, seconds in self.compiled):.1f} s{named}), "
                f"{self.writes} written")


def use_persistent_cache(path: str) -> PersistentCache:
    """Turns on JAX's persistent compilation cache at `path` (a local directory, or gs:// through etils' path
    layer): a restarted run reads its programs back instead of compiling them (gemma3-1b's step: minutes on a v5e
    chip). JAX keys each entry by the program, its compile options, the devices and the jax and jaxlib versions,
    so a changed program or another slice misses. Every program is kept, however short its compile: JAX's
    default keeps only those of a second or more, and every start compiled the rest again. The executables are
    the device's own: `fit`'s topology compiles cannot use it (above). A local folder that cannot be made is one
    line here (JAX would warn at every compile and go on without it)."""
    if not storage.is_bucket(path):
        with storage.writing("--compilation-cache-dir", path):
            pathlib.Path(path).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    global _kept
    _kept = epath.Path(path)
    cache = PersistentCache(path)
    jax.monitoring.register_event_listener(cache._event)
    jax.monitoring.register_event_duration_secs_listener(cache._duration)
    return cache


def default_cache_dir() -> pathlib.Path:
    """$XDG_CACHE_HOME/gemma-tpu/compiles, else ~/.cache/gemma-tpu/compiles."""
    return pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "gemma-tpu" / "compiles"


@dataclasses.dataclass
class _Session:
    cache_dir: pathlib.Path | None
    stream: TextIO | None
    started: float = dataclasses.field(default_factory=time.monotonic)
    compiles: int = 0  # compiler calls
    cached: int = 0  # answers read from the cache
    doing: list[str] = dataclasses.field(default_factory=list)


_session: _Session | None = None


@contextlib.contextmanager
def session(*, cache_dir: pathlib.Path | None, stream: TextIO | None = sys.stderr) -> Iterator[_Session]:
    """Compile for answers only: each compile's answers come from `cache_dir` (None: no cache) or the
    compiler, and a progress line goes to `stream` (None: quiet)."""
    global _session
    previous, _session = _session, _Session(cache_dir=cache_dir, stream=stream)
    try:
        yield _session
    finally:
        _session = previous


@contextlib.contextmanager
def doing(what: str) -> Iterator[None]:
    """Name the work the compiles inside belong to (a run, a batch search step), for the progress lines."""
    if _session is not None:
        _session.doing.append(what)
    try:
        yield
    finally:
        if _session is not None:
            _session.doing.pop()


def say(line: str) -> None:
    """A progress line with the session's elapsed time (nothing outside a session, or when quiet)."""
    if _session is not None and _session.stream is not None:
        elapsed = time.monotonic() - _session.started
        print(f"[{int(elapsed // 60)}:{elapsed % 60:04.1f}] {line}", file=_session.stream, flush=True)


class Answers:
    """What the compiler said of a program, with the methods of a compiled executable that read it."""

    def __init__(self, memory: dict[str, int], cost: dict[str, float], hlo: str):
        self._memory, self._cost, self._hlo = memory, cost, hlo

    def memory_analysis(self):
        return types.SimpleNamespace(**self._memory)

    def cost_analysis(self) -> dict[str, float]:
        return dict(self._cost)

    def as_text(self) -> str:
        return self._hlo


_MEMORY_FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes", "alias_size_in_bytes",
                  "generated_code_size_in_bytes")
_COST_KEYS = ("flops", "bytes accessed")


def _answers_of(compiled) -> dict:
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return {"memory": {name: int(getattr(memory, name)) for name in _MEMORY_FIELDS},
            "cost": {key: float(cost.get(key, 0.0)) for key in _COST_KEYS}, "hlo": compiled.as_text()}


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def compile_options(devices: list) -> dict[str, str]:
    """The XLA flags of the devices' TPU generation, where LIBTPU_INIT_ARGS does not set them (see the module docstring)."""
    accelerator = _ACCELERATOR_OF_DEVICE_KIND.get(devices[0].device_kind)
    if accelerator is None or "LIBTPU_INIT_ARGS" in os.environ:
        return {}
    return tpu_flags.compile_options(accelerator)


_program_texts = weakref.WeakKeyDictionary()  # program_text's, while their lowered programs live


def program_text(lowered) -> str:
    """`lowered.as_text()`, printed once a program: a start keys its train step here (cache_key, for kept
    refusals and estimates) and fingerprints it for config.json (step.step_fingerprint); printing
    gemma3-270m's takes about 0.3 s."""
    if lowered not in _program_texts:
        _program_texts[lowered] = lowered.as_text()
    return _program_texts[lowered]


def cache_key(lowered, devices: list, options: dict[str, str]) -> str:
    """What makes the compiler answer differently: the program, the compiler's versions, flags and options, the devices."""
    digest = hashlib.sha256(program_text(lowered).encode())
    for part in (_version("jaxlib"), _version("libtpu"), os.environ.get("XLA_FLAGS", ""), os.environ.get("LIBTPU_INIT_ARGS", ""),
                 json.dumps(options, sort_keys=True)):
        digest.update(b"\0" + part.encode())
    for device in devices:
        facts = (device.id, device.device_kind, getattr(device, "coords", None), getattr(device, "slice_index", None))
        digest.update(b"\0" + repr(facts).encode())
    return digest.hexdigest()


def _read(path: pathlib.Path) -> dict | None:
    try:
        with gzip.open(path, "rt") as file:
            return json.load(file)
    except (OSError, EOFError, ValueError):  # absent, or a partial file from a killed fit: compile again
        return None


def _write(path: pathlib.Path, entry: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    with gzip.open(partial, "wt") as file:
        json.dump(entry, file)
    partial.replace(path)


def compile(lowered, *, what: str, devices):  # noqa: A001 (every compile of the trainer goes through this one)
    """`lowered` compiled for `devices`. Outside a session: the executable. Inside: its Answers, from
    the cache when the same program was compiled before; a memory refusal is answered (raised) alike."""
    devices = list(devices)
    options = compile_options(devices)
    if _session is None:
        return _executable(lowered, devices, options)
    current, path = _session, None
    label = ": ".join([*current.doing, what])
    if current.cache_dir is not None:
        path = current.cache_dir / f"{cache_key(lowered, devices, options)}.json.gz"
        entry = _read(path)
        if entry is not None:
            current.cached += 1
            say(f"{label}: from the cache")
            return _answer(entry)
    current.compiles += 1
    say(f"{label}: compiling (compile {current.compiles})")
    try:
        entry = _answers_of(lowered.compile(options))
    except jax.errors.JaxRuntimeError as error:
        if not out_of_memory(error):
            raise
        entry = {"refusal": str(error)}
    if path is not None:
        _write(path, entry)
    return _answer(entry)


def _executable(lowered, devices: list, options: dict[str, str]):
    """The compiler's executable. With --compilation-cache-dir, a memory refusal is kept there (REFUSALS, by
    cache_key) and raised again at the next start without compiling: JAX keeps only programs that compiled,
    and the trainer's searches meet refusals at every start (the usable-HBM probe, --vocab-chunk auto's heads,
    --remat auto's policies: a refused train step costs as long to compile as one that fits)."""
    if _kept is None:
        return lowered.compile(options)
    kept = _kept / REFUSALS / f"{cache_key(lowered, devices, options)}.txt"
    if kept.exists():
        raise jax.errors.JaxRuntimeError(kept.read_text())
    try:
        return lowered.compile(options)
    except jax.errors.JaxRuntimeError as error:
        if out_of_memory(error):
            _keep(kept, str(error))
        raise


def out_of_memory(error: Exception) -> bool:
    """Whether XLA's error is for memory (RESOURCE_EXHAUSTED): the compiler's refusal of a program, or the
    device's own at run time."""
    return "RESOURCE_EXHAUSTED" in str(error)


def kept_figures(lowered, devices) -> dict[str, float] | None:
    """The figures a start before kept of the program `lowered` on `devices` (figures_kept), if any."""
    if _kept is None:
        return None
    try:
        return json.loads(_figures_path(lowered, list(devices)).read_text())
    except (FileNotFoundError, ValueError):  # not kept yet, or not readable: worked out again
        return None


def figures_kept(lowered, devices, *, figures: Callable[[], dict[str, float]]) -> dict[str, float]:
    """`figures()` of the program `lowered` on `devices` (--remat auto's speed estimate of a policy: its
    compiled step's FLOPs, bytes and collectives per chip). With --compilation-cache-dir they are kept there
    (ESTIMATES, by cache_key, as refusals are) and read back at the next start: working them out compiles
    the loss head alone and reads the whole optimized program's text, at every start, for every policy
    compared. A changed program has another key and is worked out again."""
    answer = kept_figures(lowered, devices)
    if answer is None:
        answer = figures()
        if _kept is not None:
            _keep(_figures_path(lowered, list(devices)), json.dumps(answer))
    return answer


def _figures_path(lowered, devices: list) -> epath.Path:
    return _kept / ESTIMATES / f"{cache_key(lowered, devices, compile_options(devices))}.json"


def _keep(kept: epath.Path, text: str) -> None:
    """Process 0 writes `text` to `kept` under a temporary name and renames it: a killed write leaves nothing behind."""
    if jax.process_index() != 0:
        return
    kept.parent.mkdir(parents=True, exist_ok=True)
    partial = shared_files.temporary_sibling(kept)  # unique across hosts: runs on several slices may share the cache
    partial.write_text(text)
    partial.rename(kept)


def _answer(entry: dict) -> Answers:
    if "refusal" in entry:
        raise jax.errors.JaxRuntimeError(entry["refusal"])
    return Answers(entry["memory"], entry["cost"], entry["hlo"])
