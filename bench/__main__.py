"""Every CPU benchmark in one go: `python -m bench [--quick]` (`make bench`, `make bench-quick`).

Throughput of ours against the baseline on each configuration, then the data pipeline, whose
loader is compared with the step times just measured.
"""

import argparse
import pathlib
import platform
import statistics
import subprocess
import sys
import time
from importlib import metadata

from bench import data_pipeline, inputs as inputs_lib, throughput
from trainer.run.mesh import jax_entry_point

PACKAGES = ("jax", "jaxlib", "flax", "optax", "gemma", "grain", "sentencepiece", "array_record")


def cpu_model() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    return f"{fields.get('Model name', '?').strip()}, {fields.get('CPU(s)', '?').strip()} CPUs"


@jax_entry_point("bench: ")
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, smaller data inputs (a few minutes)")
    parser.add_argument("--workdir", default=inputs_lib.DEFAULT_WORKDIR, help="generated inputs and outputs go here")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} | {cpu_model()} | Python {platform.python_version()} | "
          + ", ".join(f"{name} {metadata.version(name)}" for name in PACKAGES))
    workdir = pathlib.Path(args.workdir)
    inputs = inputs_lib.build_inputs(workdir)
    schedule = throughput.QUICK if args.quick else throughput.FULL
    step_seconds = {}
    for config in throughput.CONFIGS.values():
        results = throughput.run(config, inputs, schedule)
        step_seconds[config.name] = (config.seq_len, config.batch_size, statistics.median(results["ours"].step_times))
    data_pipeline.run(inputs, workdir / "data_pipeline", quick=args.quick, step_seconds=step_seconds)
    print(f"done in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
