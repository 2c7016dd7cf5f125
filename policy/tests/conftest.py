import copy
import json
from pathlib import Path

import pytest

COMPLIANT_GRAPH = Path(__file__).parent / "data" / "compliant_graph.json"


@pytest.fixture
def compliant_graph() -> list[dict]:
    """A hand-written preview graph (the `infra.preview --json` format) that passes every rule."""
    return json.loads(COMPLIANT_GRAPH.read_text())


@pytest.fixture
def graph_entry(compliant_graph):
    """A fresh deep copy of one entry of the compliant graph, by resource name."""

    def entry(name: str) -> dict:
        return copy.deepcopy(next(e for e in compliant_graph if e["name"] == name))

    return entry
