"""The slice catalog: the hardware facts node pools and workloads both derive from."""

import pytest

from infra.catalog import tpu
from infra.errors import ConfigError

# REFERENCE section 1 (GKE's TPU tables): accelerator, topology -> label, machine, chips, hosts.
KNOWN_SLICES = [
    ("v6e", "1x1", "tpu-v6e-slice", "ct6e-standard-1t", 1, 1),
    ("v6e", "2x2", "tpu-v6e-slice", "ct6e-standard-4t", 4, 1),
    ("v6e", "2x4", "tpu-v6e-slice", "ct6e-standard-4t", 8, 2),
    ("v6e", "4x4", "tpu-v6e-slice", "ct6e-standard-4t", 16, 4),
    ("v6e", "8x16", "tpu-v6e-slice", "ct6e-standard-4t", 128, 32),
    ("v6e", "16x16", "tpu-v6e-slice", "ct6e-standard-4t", 256, 64),
    ("v5e", "1x1", "tpu-v5-lite-podslice", "ct5lp-hightpu-1t", 1, 1),
    ("v5e", "2x2", "tpu-v5-lite-podslice", "ct5lp-hightpu-4t", 4, 1),
    ("v5e", "2x4", "tpu-v5-lite-podslice", "ct5lp-hightpu-4t", 8, 2),
    ("v5e", "16x16", "tpu-v5-lite-podslice", "ct5lp-hightpu-4t", 256, 64),
    ("v5p", "2x2x1", "tpu-v5p-slice", "ct5p-hightpu-4t", 4, 1),
    ("v5p", "2x2x2", "tpu-v5p-slice", "ct5p-hightpu-4t", 8, 2),
    ("v5p", "2x2x4", "tpu-v5p-slice", "ct5p-hightpu-4t", 16, 4),
    ("v5p", "2x4x4", "tpu-v5p-slice", "ct5p-hightpu-4t", 32, 8),
    ("v5p", "4x4x4", "tpu-v5p-slice", "ct5p-hightpu-4t", 64, 16),
]


@pytest.mark.parametrize("accelerator,topology,label,machine,chips,hosts", KNOWN_SLICES)
def test_known_slices(accelerator, topology, label, machine, chips, hosts):
    spec = tpu.slice_spec(accelerator, topology)
    assert (spec.gke_accelerator, spec.machine_type, spec.chips, spec.hosts) == (label, machine, chips, hosts)
    assert spec.multi_host == (hosts > 1)
    assert spec.node_selector == {
        "cloud.google.com/gke-tpu-accelerator": label,
        "cloud.google.com/gke-tpu-topology": topology,
    }


def test_every_catalog_slice_is_consistent():
    slices = tpu.catalog()
    assert {s.accelerator for s in slices} == set(tpu.ACCELERATORS) == {"v6e", "v5e", "v5p"}
    for spec in slices:
        assert spec.hosts * spec.chips_per_host == spec.chips, spec
        assert spec.machine_type.endswith(f"-{spec.chips_per_host}t"), spec
        assert spec.topology in tpu.topologies(spec.accelerator)


def test_unknown_topology_names_the_valid_ones():
    with pytest.raises(ConfigError, match=r"'3x3' is not a v6e slice; choose one of 1x1, 2x2, 2x4, .*16x16$"):
        tpu.slice_spec("v6e", "3x3")
    with pytest.raises(ConfigError, match=r"2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4"):
        tpu.slice_spec("v5p", "2x4")


def test_unknown_accelerator_names_the_valid_ones():
    with pytest.raises(ConfigError, match=r"'v4' is not supported; choose one of v6e, v5e, v5p"):
        tpu.slice_spec("v4", "2x2x1")


def test_serving_slices_are_single_host_with_2x4_on_one_8_chip_machine():
    """vLLM serves from one host: 1x1 and 2x2 as the catalog has them, 2x4 as the family's 8-chip
    machine (GKE's single-host 2x4), nothing larger; v5p has no 8-chip host."""
    from infra.catalog.tpu import serving_slices

    assert [(s.topology, s.machine_type, s.hosts) for s in serving_slices("v6e")] == [
        ("1x1", "ct6e-standard-1t", 1), ("2x2", "ct6e-standard-4t", 1), ("2x4", "ct6e-standard-8t", 1)]
    assert [s.machine_type for s in serving_slices("v5e")][-1] == "ct5lp-hightpu-8t"
    assert [s.topology for s in serving_slices("v5p")] == ["2x2x1"]
