"""--compilation-cache-dir: a second start of the same run reads its compiled programs back from JAX's
persistent compilation cache instead of compiling them (gemma3-1b's step takes minutes to compile on a v5e
chip: every restart paid them again), compiles nothing, and says so in one line; a changed program misses."""

import re
import subprocess
import sys

from tests.trainer.test_bad_inputs import REPO
from tests.trainer.test_train import tiny_args

LINE = re.compile(r"trainer: compilation cache (?P<path>\S+): (?P<hits>\d+) programs read back \(about \d+ s of compiling "
                  r"saved\), (?P<compiled>\d+) compiled \([\d.]+ s(?P<names>.*)\), (?P<writes>\d+) written$")


def _start(workdir, prepared_dir, tokenizer_path, cache, *extra) -> dict:
    done = subprocess.run([sys.executable, "-m", "trainer", *tiny_args(workdir, prepared_dir, tokenizer_path, "--steps", "1",
                                                                    "--eval-fraction", "0", "--compilation-cache-dir", str(cache),
                                                                    *extra)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [match for match in map(LINE.match, done.stderr.splitlines()) if match]
    assert len(lines) == 1, done.stderr[-3000:]
    line = lines[0]
    return {"hits": int(line["hits"]), "compiled": int(line["compiled"]), "writes": int(line["writes"]),
            "names": re.findall(r", (\S+) [\d.]+ s", line["names"]), "path": line["path"]}


def test_a_second_start_compiles_nothing_and_a_changed_program_misses(tmp_path, prepared_dir, tokenizer_path):
    cache = tmp_path / "compiles"
    first = _start(tmp_path / "first", prepared_dir, tokenizer_path, cache)
    # Every program is kept, however short its compile (JAX's default keeps those of a second or more).
    assert first["hits"] == 0 and first["compiled"] == first["writes"] > 1 and first["path"] == str(cache), first
    kept = sorted(path.name for path in cache.iterdir())
    # Another workdir, the same programs: all read back, none compiled.
    second = _start(tmp_path / "second", prepared_dir, tokenizer_path, cache)
    assert second == {"hits": first["writes"], "compiled": 0, "writes": 0, "names": [], "path": str(cache)}
    assert sorted(path.name for path in cache.iterdir()) == kept
    # Another learning rate is another train step (its schedule is in the program): that one compiles again.
    changed = _start(tmp_path / "changed", prepared_dir, tokenizer_path, cache, "--lr", "1e-3")
    assert changed["compiled"] == changed["writes"] == 1 and changed["names"] == ["jit(train)"], changed
    assert changed["hits"] == first["writes"] - 1
