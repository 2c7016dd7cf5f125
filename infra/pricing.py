"""Estimated TPU price of a stack, for the `tpuCostPerHourUsd` output and the README's stack table.

Prices are USD per chip-hour. On-demand: Google Cloud list prices for us-east5 / us-central1 on
https://cloud.google.com/tpu/pricing as of 2025. Spot: rounded estimates (Spot prices move as often
as daily; see https://cloud.google.com/spot-vms/pricing). Neither was re-checked from the build
machines, which have no network. Reservations and flex-start are billed at other rates, and the CPU
pool, disks and network are not included: the output is for comparing stacks, not a quote.
"""

from dataclasses import dataclass

from infra.config import StackConfig

PRICES_AS_OF = "2025"
PRICES_SOURCE = f"https://cloud.google.com/tpu/pricing (us-east5, {PRICES_AS_OF}); Spot estimated"


@dataclass(frozen=True, kw_only=True)
class ChipPrice:
    on_demand: float
    spot: float


PRICE_PER_CHIP_HOUR_USD: dict[str, ChipPrice] = {
    "v6e": ChipPrice(on_demand=2.70, spot=1.35),
    "v5e": ChipPrice(on_demand=1.20, spot=0.60),
    "v5p": ChipPrice(on_demand=4.20, spot=2.10),
}


def stack_chips(config: StackConfig) -> int:
    return config.slice.chips * config.tpu.slices


def tpu_cost_per_hour(config: StackConfig) -> dict[str, float | int | str]:
    """What the stack's TPU chips cost per hour while the pools are scaled up."""
    chips = stack_chips(config)
    price = PRICE_PER_CHIP_HOUR_USD[config.tpu.accelerator]
    return {
        "chips": chips,
        "onDemand": round(chips * price.on_demand, 2),
        "spot": round(chips * price.spot, 2),
        "source": PRICES_SOURCE,
    }
