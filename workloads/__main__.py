"""`python -m workloads render --stack NAME [--out DIR]`: the run's Kubernetes objects as YAML, offline;
`python -m workloads fit --stack NAME [--run RUN] [--json]`: each run's step compiled for its TPU slice
(workloads.fit), with progress on stderr and the compiler's answers kept for the next fit (docs/fit.md).

Prints (or writes into DIR, one file per object, numbered in apply order) the namespace, the
ServiceAccounts of training and of data preparation, the Kueue queue (with gemma-tpu:queue), the
data preparation Job of each dataset and each run's training Job or JobSet that `pulumi up`
applies for the stack. The image digest exists only after the build:
without a configured `gemma-tpu:image` the image is the placeholder `${TRAINER_IMAGE}` (fill it
with `envsubst` before `kubectl apply`).
Without `gcp:project` in the stack file, the project (and the bucket and account names derived from
it) is infra.config.stack_files' placeholder. An invalid config exits with code 2 and its one-line message.
"""

import argparse
import os
import pathlib
import sys
from typing import Any

import yaml

from infra.cloud.checkpointing import checkpoint_configurations
from infra.config import StackConfig, parse_stack_config
from infra.config.stack_files import offline_values
from infra.errors import ConfigError
from infra.queueing.queues import queue_objects
from trainer import storage
from trainer.contract import USER_ERROR
from trainer.errors import OneLineParser, UserError
from workloads import manifests, serving
from workloads.spec import RunSpec, run_specs

IMAGE_PLACEHOLDER = "${TRAINER_IMAGE}"


class _Dumper(yaml.SafeDumper):
    """Plain YAML for kubectl and reviewers: no `&id001` anchors where builders share a dict."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(objects: list[dict[str, Any]]) -> str:
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, explicit_start=True)


def render_config(stack: str) -> StackConfig:
    """The config of stack file `stack` (a name or a path); ConfigError when it is invalid."""
    values, stack_name = offline_values(stack, doing="rendering")
    return parse_stack_config(values, stack_name)


def render_specs(config: StackConfig) -> tuple[RunSpec, ...]:
    return run_specs(config, image=config.image or IMAGE_PLACEHOLDER)


def stack_objects(config: StackConfig, served_version: str | None = None) -> list[dict[str, Any]]:
    """Every Kubernetes object `pulumi up` applies for the stack's runs, in order, then its serving
    of `served_version` (None: as before anything is published; docs/serving.md)."""
    specs = render_specs(config)
    cluster_objects = [*checkpoint_configurations(config), *queue_objects(config)]
    return manifests.all_objects(specs, cluster_objects) + serving.stack_serving_objects(config, specs, served_version)


def write(objects: list[dict[str, Any]], directory: pathlib.Path) -> list[pathlib.Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, obj in enumerate(objects):
        path = directory / f"{index:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
        path.write_text(to_yaml([obj]))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m workloads", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    render = commands.add_parser("render", help="print or write the stack's Kubernetes objects as YAML")
    render.add_argument("--stack", required=True, help="the stack, as in Pulumi.<stack>.yaml (or a path to a stack file)")
    render.add_argument("--out", "--output", dest="out", help="write one YAML file per object into this directory")
    render.add_argument("--served-version", help="the published version serving serves, as `pulumi up` finds the newest "
                        "(e.g. 20261205T120000Z-RUN-0123abcd.hf); default: none published yet, no serving replicas")
    fit = commands.add_parser("fit", help="compile each run's training step for its TPU slice: memory per chip, cost, largest batch")
    fit.add_argument("--stack", required=True, help="the stack, as in Pulumi.<stack>.yaml (or a path to a stack file)")
    fit.add_argument("--run", help="only this run of gemma-tpu:runs (default: every run)")
    fit.add_argument("--json", action="store_true", help="one JSON list of the runs' figures, for tools")
    fit.add_argument("--no-batch-search", dest="search_batch", action="store_false",
                     help="skip the compiles that find the largest batch that fits (one compile a run instead of 2-4)")
    fit.add_argument("--splits", action="store_true",
                     help="also compile each FSDP group that divides a slice and name the fastest that fits (gemma-tpu:training.fsdp)")
    fit.add_argument("--cache-dir",
                     help="where the compiler's answers are kept (default $XDG_CACHE_HOME/gemma-tpu/compiles or ~/.cache/...)")
    fit.add_argument("--no-cache", action="store_true", help="compile everything again, and keep nothing")
    fit.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    try:
        args = parser.parse_args(argv)
        _check_folders(args)
        config = render_config(args.stack)
        if args.command == "render" and args.served_version is not None:
            serving.check_served_version(config, args.served_version)
    except (ConfigError, UserError) as error:
        print(f"error: {error}", file=sys.stderr)
        return USER_ERROR
    if args.command == "fit":
        return fit_command(config, args)
    objects = stack_objects(config, args.served_version)
    if args.out is None:
        print(to_yaml(objects), end="")
        return 0
    for path in write(objects, pathlib.Path(args.out)):
        print(path)
    for spec in render_specs(config):
        print(f"follow {spec.name}: {manifests.logs_command(spec)}")
    if config.queue.enabled:
        print(f"the queue: kubectl get workloads -n {config.namespace}")
    return 0


def _check_folders(args: argparse.Namespace) -> None:
    """The folders a command writes, before any work (trainer.storage): not empty, no file on their way."""
    if getattr(args, "out", None) is not None:
        storage.check_folder("--out", args.out, to="write the objects in", buckets=False)
    if getattr(args, "cache_dir", None) is not None:
        storage.check_folder("--cache-dir", args.cache_dir, to="keep the compiler's answers in", buckets=False)


def fit_command(config: StackConfig, args: argparse.Namespace) -> int:
    # XLA's C++ start-up notices (below warnings) say nothing about the fit.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from trainer.run import compile_answers, mesh
    from workloads import fit

    cache_dir = None if args.no_cache else pathlib.Path(args.cache_dir or compile_answers.default_cache_dir())
    try:
        mesh.require_requested_platform()
        with compile_answers.session(cache_dir=cache_dir, stream=None if args.quiet else sys.stderr) as session:
            reports = [run.report for run in fit.fit_runs(config, image=config.image or IMAGE_PLACEHOLDER, run_name=args.run,
                                                          search_batch=args.search_batch, compare_splits=args.splits)]
            compile_answers.say(f"{session.compiles} compiled, {session.cached} from the cache"
                                + (f" ({cache_dir})" if cache_dir else ""))
    except (ValueError, UserError) as error:
        print(f"error: {error}", file=sys.stderr)
        return USER_ERROR
    print(fit.to_json(reports) if args.json else fit.table(reports))
    if args.splits and not args.json:
        print(fit.splits_table(reports))
    misfits = [report for report in reports if not report["fits"]]
    if not args.json:
        for report in reports:
            if report["fits"]:
                print(fit.verdict(report))
    for report in misfits:
        print(f"error: {fit.advice(report)}", file=sys.stderr)
    return USER_ERROR if misfits else 0


if __name__ == "__main__":
    sys.exit(main())
