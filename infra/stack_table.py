"""`python -m infra.stack_table [--training]`: Markdown tables for docs/stacks.md: the shipped
stacks, derived from the stack files, the catalog and the price table; with --training, the
`gemma-tpu:training` keys that are trainer options, with the trainer's defaults (tests keep the doc
in step)."""

import sys

from infra.config import parse_stack_config
from infra.config.stack_files import offline_values, shipped_stacks
from infra.config.training import TRAINER_OPTIONS, stack_models
from infra.pricing import tpu_cost_per_hour

HEADER = (
    "| stack | cluster | TPU shape | chips | TPU hosts | TPU node pools | est. $/h on-demand |\n"
    "|---|---|---|---|---|---|---|"
)


def markdown_table() -> str:
    configs = []
    for stack in shipped_stacks():
        configs.append(parse_stack_config(offline_values(stack)[0], stack))
    rows = [HEADER]
    for config in sorted(configs, key=lambda c: (c.cluster_mode != "standard", c.total_hosts, c.stack)):
        spec, cost = config.slice, tpu_cost_per_hour(config)
        slices = f"{config.tpu.slices} x " if config.tpu.slices > 1 else ""
        pools = (
            f"{config.tpu.slices} {'pools' if config.tpu.slices > 1 else 'pool'} of {spec.hosts} x {spec.machine_type}"
            if config.cluster_mode == "standard"
            else f"none: GKE provisions {spec.machine_type} per pod"
        )
        rows.append(
            f"| {config.stack} | {config.cluster_mode} | {slices}{spec.accelerator} {spec.topology} | {cost['chips']} "
            f"| {config.total_hosts} | {pools} | {cost['onDemand']:.2f} |"
        )
    return "\n".join(rows)


def training_table() -> str:
    rows = ["| key | default (the trainer's) | trainer flag | what |", "|---|---|---|---|"]
    for option in TRAINER_OPTIONS:
        default = "(unset)" if option.default is None else option.default
        what = option.what
        if option.key == "model":
            what = ", ".join(stack_models())
        elif option.above is not None:
            what = f"above {option.above:g}, at most {option.maximum:g}: {what}"
        elif option.maximum is not None:
            what = f"{option.minimum}-{option.maximum}: {what}"
        elif option.minimum is not None:
            what = f"{option.minimum} or more: {what}"
        rows.append(f"| `gemma-tpu:training.{option.key}` | {default} | `{option.flag}` | {what} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(training_table() if sys.argv[1:] == ["--training"] else markdown_table())
