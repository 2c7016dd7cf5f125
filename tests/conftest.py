"""The suite's order: the trainer's whole runs first, then its other tests (compiles), the benchmarks' dry runs,
and the many short tests of the infrastructure and workloads last. `make test` spreads files over the cores
(pytest-xdist, a file's tests on one worker, handed out in this order): short files last fill the cores until
all finish, where a long file last would leave the other cores idle while it runs."""

import pathlib

_HERE = pathlib.Path(__file__).parent


def _rank(item) -> int:
    parts = pathlib.Path(str(item.path)).relative_to(_HERE).parts
    if parts[0] == "trainer":
        return 0 if len(parts) == 2 else 1  # tests/trainer/test_*.py: whole runs of the trainer
    return 2 if parts[0] == "bench" else 3


def pytest_collection_modifyitems(items):
    items.sort(key=_rank)  # stable: each file keeps its tests' order
