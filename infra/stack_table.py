"""`python -m infra.stack_table`: the Markdown table of the shipped stacks for docs/stacks.md,
derived from the stack files, the catalog and the price table (a test keeps the doc in step)."""

from infra.config import parse_stack_config
from infra.pricing import tpu_cost_per_hour
from infra.stack_files import offline_values, shipped_stacks

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


if __name__ == "__main__":
    print(markdown_table())
