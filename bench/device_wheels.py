"""The wheels the accelerator machine lacks, for carrying to it: `python -m bench.device_wheels` (`make device-wheels`).

The lent TPU machine has Python 3.11 with JAX, jaxlib, libtpu, numpy and scipy installed, and no
network. Everything else `python -m bench.device` imports (the trainer's own packages and their
dependencies) is downloaded here into the ignored folder `.device-wheels/`, as cp311 manylinux x86_64
wheels at the versions and hashes trainer/requirements.lock pins, so the device runs the trainer on the
package set the trainer image runs, but for JAX itself (0.10.2 there) and flax: the locked flax needs
Python 3.12, so the newest release for 3.11 is carried (PYTHON_311_PINS). The machine's own package
index is not used: it holds older orbax/tensorstore (0.12.4, 0.1.85), no grain, and what it resolves
is not pinned by us. The wheels come from pip's configured index (pip.conf, PIP_INDEX_URL), checked against
the lock's hashes. bench/device_command.sh installs the folder with `pip --no-deps --target`.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import subprocess
import sys
import tempfile

LOCK = pathlib.Path("trainer/requirements.lock")
DEFAULT_DEST = pathlib.Path(".device-wheels")
# What bench.device imports, directly or through the trainer, that the machine does not have installed
# (it has jax, jaxlib, libtpu, numpy, scipy, ml-dtypes, opt-einsum); gcsfs, pyarrow, matplotlib and the
# Google Cloud clients are imported only by paths the benchmark does not take.
CARRIED = (
    "absl-py", "aiofiles", "array-record", "cloudpickle", "etils", "flax", "fsspec", "grain", "humanize",
    "markdown-it-py", "mdurl", "msgpack", "optax", "orbax-checkpoint", "portpicker", "protobuf", "psutil",
    "pygments", "pyyaml", "rich", "safetensors", "sentencepiece", "simplejson", "tensorboardx", "tensorstore",
    "treescope", "typing-extensions", "zipp",
)
PYTHON_VERSION = "3.11"
# Locked versions that need a newer Python than the machine's, replaced by the newest release for it (the same
# file the machine's own index holds).
PYTHON_311_PINS = {
    "flax": "flax==0.12.8 --hash=sha256:807931d369cbc716fc447801ab39cd6c3c2614d573387a2319a028675dd34fe5\n",
}
# pip matches a manylinux tag exactly: every glibc level the locked wheels are built for, none newer than the
# machine's (JAX 0.10.2's own jaxlib there is manylinux_2_27).
PLATFORMS = ("manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux_2_12_x86_64", "manylinux2010_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64")


def locked_entries(lock_text: str, names: tuple[str, ...]) -> str:
    """The lock's `name==version \\ --hash=...` entries for `names` (normalised), as a requirements file;
    PYTHON_311_PINS's instead where it names one."""
    entries = re.findall(r"^([A-Za-z0-9._-]+)==(\S+)((?: \\\n +--hash=sha256:[0-9a-f]{64})+)", lock_text, re.M)
    by_name = {re.sub(r"[-_.]+", "-", name).lower(): (name, version, hashes) for name, version, hashes in entries}
    missing = sorted(set(names) - set(by_name))
    if missing:
        raise SystemExit(f"error: {LOCK} pins no {', '.join(missing)}; add it to trainer/requirements.txt and run `make lock`")
    return "".join(PYTHON_311_PINS.get(name) or f"{by_name[name][0]}=={by_name[name][1]}{by_name[name][2]}\n"
                   for name in names)


def download(dest: pathlib.Path) -> list[pathlib.Path]:
    """Downloads the carried wheels into `dest` (emptied of older wheels first), each checked against the lock's hash."""
    dest.mkdir(exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as requirements:
        requirements.write(locked_entries(LOCK.read_text(), CARRIED))
        requirements.flush()
        platforms = [flag for platform in PLATFORMS for flag in ("--platform", platform)]
        subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet", "--no-deps",
                        "--only-binary=:all:", "--require-hashes", "--python-version", PYTHON_VERSION, "--implementation",
                        "cp", *platforms, "--dest", str(dest), "-r", requirements.name], check=True)
    return sorted(dest.glob("*.whl"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.device_wheels", description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=pathlib.Path, default=DEFAULT_DEST, help="where the wheels go (default .device-wheels)")
    args = parser.parse_args(argv)
    wheels = download(args.dest)
    total = sum(wheel.stat().st_size for wheel in wheels)
    print(f"{len(wheels)} wheels, {total / 2**20:.1f} MiB in {args.dest}/ (carry it: bench/device_command.sh)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
