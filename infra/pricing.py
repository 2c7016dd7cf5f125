"""Estimated TPU price of a stack, for the `tpuCostPerHourUsd` output and the stack table in docs/stacks.md.

Each on-demand price says where it comes from and when it was read. Spot prices are not estimated:
Google sets them per region and changes them as often as daily, and they differ from on-demand by
a different factor per TPU version and region, so a fixed fraction would mislead; the output points
to the page that has them. Reservations and flex-start are billed at other rates, and the CPU pool,
disks and network are not included: the output is for comparing stacks, not a quote.
"""

from dataclasses import dataclass

from infra.config import StackConfig

TPU_PRICING_URL = "https://cloud.google.com/tpu/pricing"
SPOT_PRICING_URL = "https://cloud.google.com/spot-vms/pricing"
SPOT_NOT_ESTIMATED = f"not estimated: Spot prices move by region and day, see {SPOT_PRICING_URL}"


@dataclass(frozen=True, kw_only=True)
class ChipPrice:
    on_demand: float  # USD per chip-hour
    region: str
    source: str
    # When the figure was read from `source`. These were read before this project had machines of its
    # own, which reach no web page; re-read them there and update `read` with the figure.
    read: str

    @property
    def citation(self) -> str:
        return f"{self.source}, {self.region}, on-demand, read {self.read}"


PRICE_PER_CHIP_HOUR_USD: dict[str, ChipPrice] = {
    "v6e": ChipPrice(on_demand=2.70, region="us-east5", source=TPU_PRICING_URL, read="from memory of the 2025 page, not re-read since"),
    "v5e": ChipPrice(on_demand=1.20, region="us-east5", source=TPU_PRICING_URL, read="from memory of the 2025 page, not re-read since"),
    "v5p": ChipPrice(on_demand=4.20, region="us-east5", source=TPU_PRICING_URL, read="from memory of the 2025 page, not re-read since"),
}


def stack_chips(config: StackConfig) -> int:
    return config.slice.chips * config.tpu.slices


def tpu_cost_per_hour(config: StackConfig) -> dict[str, float | int | str]:
    """What the stack's TPU chips cost per hour on demand while the pools are scaled up; with serving,
    also what one serving replica's node costs per hour, billed while it is up even when idle
    (serving has no replicas until a version is published)."""
    chips = stack_chips(config)
    price = PRICE_PER_CHIP_HOUR_USD[config.tpu.accelerator]
    cost = {"chips": chips, "onDemand": round(chips * price.on_demand, 2), "source": price.citation, "spot": SPOT_NOT_ESTIMATED}
    if config.serving is not None:
        serving, serving_price = config.serving.slice, PRICE_PER_CHIP_HOUR_USD[config.serving.slice.accelerator]
        cost["servingReplica"] = {"chips": serving.chips, "onDemand": round(serving.chips * serving_price.on_demand, 2),
                                  "source": serving_price.citation}  # fmt: skip
    return cost
