"""`python -m bench.image` (`make image-check`): the trainer image's packages (trainer/requirements.lock:
no gemma, kauldron or TensorFlow), installed the way trainer/Dockerfile installs them, into a fresh
virtualenv of this Python 3.12; no Docker needed, PyPI is.

Prints the installed size (site-packages, libtpu included, and its largest packages) and pip check's
report (a missing dependency fails), then runs the trainer's entry points on exactly that package set with
the virtualenv's Python: a tiny fine-tune (`python -m trainer --preset tiny`), the preparation of a Parquet file
(`python -m trainer.data.prepare`) and the Hugging Face export (`python -m trainer.export`).
Exit status 1 when the install or an entry point fails. Needs only the standard library to start.
"""

import argparse
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import time
from importlib import metadata

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "trainer" / "Dockerfile"
INSTALL = "pip install "


def install_args(dockerfile: pathlib.Path = DOCKERFILE) -> list[str]:
    """The arguments of the Dockerfile's `pip install` of the locks (run in the directory it copies them to)."""
    for line in dockerfile.read_text().splitlines():
        if line.startswith("RUN ") and INSTALL in line:
            return shlex.split(line.split(INSTALL, 1)[1])
    raise SystemExit(f"{dockerfile}: no RUN line with {INSTALL.strip()!r}")


def disk_usage(path: pathlib.Path) -> int:
    """Bytes of disk used under `path`, as `du` counts them."""
    return sum(entry.lstat().st_blocks * 512 for entry in path.rglob("*")) + path.lstat().st_blocks * 512


def largest_packages(site: pathlib.Path, count: int) -> list[tuple[str, int]]:
    sizes = []
    for dist in metadata.distributions(path=[str(site)]):
        files = [site / file for file in dist.files or ()]
        sizes.append((dist.metadata["Name"], sum(file.lstat().st_size for file in files if file.exists())))
    return sorted(sizes, key=lambda item: -item[1])[:count]


def run(command: list[str], **kwargs) -> None:
    print("+", shlex.join(str(part) for part in command), flush=True)
    subprocess.run(command, check=True, **kwargs)


def entry_points(python: str, workdir: pathlib.Path, steps: int) -> None:
    """The trainer's three commands on the virtualenv's packages alone (no PYTHONPATH, JAX on the CPU)."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"} | {"JAX_PLATFORMS": "cpu"}
    train = workdir / "run"
    run([python, "-m", "trainer", "--preset", "tiny", "--steps", str(steps), "--workdir", train], cwd=ROOT, env=env)
    parquet = workdir / "stories.parquet"
    run([python, "-c", "import sys, pyarrow, pyarrow.parquet as pq; from trainer.data.corpus import SEPARATOR; "
         "stories = [s.strip() for s in open(sys.argv[1]).read().split(SEPARATOR) if s.strip()][:200]; "
         "pq.write_table(pyarrow.table({'text': stories}), sys.argv[2])",
         train / "data" / "corpus.txt", parquet], cwd=ROOT, env=env)
    run([python, "-m", "trainer.data.prepare", "--input", parquet, "--tokenizer", train / "data" / "tokenizer.model",
         "--output", workdir / "prepared"], cwd=ROOT, env=env)
    run([python, "-m", "trainer.export", "--run", train, "--out", workdir / "hf"], cwd=ROOT, env=env)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.image", description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="/tmp/gemma-tpu-image", help="the virtualenv and the runs go here (replaced)")
    parser.add_argument("--steps", type=int, default=20, help="training steps of the tiny run")
    parser.add_argument("--size-only", action="store_true", help="install and measure, run nothing")
    args = parser.parse_args(argv)
    if sys.version_info[:2] != (3, 12):
        raise SystemExit("python -m bench.image: run it with Python 3.12, the image's Python")
    workdir = pathlib.Path(args.workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    venv = workdir / "venv"
    run([sys.executable, "-m", "venv", venv])
    python = str(venv / "bin" / "python")
    # PyPI only, as the image build sees it: no local package folders (their files may hash differently).
    pypi = {key: value for key, value in os.environ.items() if key != "PIP_FIND_LINKS"} | {"PIP_CONFIG_FILE": os.devnull}
    start = time.perf_counter()
    try:
        run([python, "-m", "pip", "install", "--quiet", *install_args()], cwd=ROOT / "trainer", env=pypi)
    except subprocess.CalledProcessError:
        return 1
    installed = time.perf_counter() - start
    site = venv / "lib" / "python3.12" / "site-packages"
    used = disk_usage(site)
    print(f"\ninstalled in {installed:.0f} s: {used / 1e9:.2f} GB ({used / 2**30:.2f} GiB) in {site} (du), "
          f"{len(list(metadata.distributions(path=[str(site)])))} packages; the largest:")
    for name, size in largest_packages(site, 12):
        print(f"  {size / 1e6:8.0f} MB  {name}")
    # The lock is pip-compile's full resolution of the trainer's pins: every declared dependency is in it.
    check = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True)
    print("pip check:")
    print("".join(f"  {line}\n" for line in sorted(check.stdout.splitlines())), flush=True)
    if check.returncode:
        print("python -m bench.image: the image's lock misses a declared dependency (pip check)", file=sys.stderr)
        return 1
    if args.size_only:
        return 0
    try:
        entry_points(python, workdir, args.steps)
    except subprocess.CalledProcessError as error:
        print(f"python -m bench.image: failed on the image's packages: {shlex.join(map(str, error.cmd))}", file=sys.stderr)
        return 1
    print("\nthe trainer's entry points ran on the image's package set")
    return 0


if __name__ == "__main__":
    sys.exit(main())
