"""--compilation-cache-dir: a second start of the same run reads its compiled programs back from JAX's
persistent compilation cache instead of compiling them (gemma3-1b's step takes minutes to compile on a v5e
chip: every restart paid them again), and says so in one line."""

import re
import subprocess
import sys

from tests.trainer.test_bad_inputs import REPO
from tests.trainer.test_train import tiny_args

LINE = re.compile(r"trainer: compilation cache (?P<path>\S+): (?P<hits>\d+) programs read back \(about \d+ s of compiling "
                  r"saved\), (?P<writes>\d+) compiled and written")


def _start(workdir, prepared_dir, tokenizer_path, cache) -> dict:
    done = subprocess.run([sys.executable, "-m", "trainer", *tiny_args(workdir, prepared_dir, tokenizer_path, "--steps", "1",
                                                                    "--eval-fraction", "0", "--compilation-cache-dir", str(cache))],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [match for match in map(LINE.match, done.stderr.splitlines()) if match]
    return {"hits": int(line["hits"]), "writes": int(line["writes"]), "path": line["path"]}


def test_a_second_start_reads_its_programs_back_and_compiles_nothing_it_kept(tmp_path, prepared_dir, tokenizer_path):
    cache = tmp_path / "compiles"
    first = _start(tmp_path / "first", prepared_dir, tokenizer_path, cache)
    assert first["hits"] == 0 and first["writes"] >= 1 and first["path"] == str(cache)  # the train step at least
    kept = sorted(path.name for path in cache.iterdir())
    # Another workdir, the same program: every program the first start kept is read back.
    second = _start(tmp_path / "second", prepared_dir, tokenizer_path, cache)
    assert second == {"hits": first["writes"], "writes": 0, "path": str(cache)}
    assert sorted(path.name for path in cache.iterdir()) == kept
