"""Every module groups its imports the same way: `from __future__`, the standard library, third-party packages, then
this project's own (trainer, infra, workloads, bench, policy, stack), the last sorted by the module they name, with
no gap inside a group (PEP 8's order; the issue of mixed orders in trainer/loop.py and trainer/config.py)."""

import ast
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
OURS = {"trainer", "infra", "workloads", "bench", "tests", "policy", "stack"}
FOLDERS = ("trainer", "infra", "workloads", "bench", "policy")


def _group(node: ast.Import | ast.ImportFrom) -> int:
    name = (node.module or "") if isinstance(node, ast.ImportFrom) else node.names[0].name
    top = name.split(".")[0]
    if isinstance(node, ast.ImportFrom) and node.level:
        return 3
    return 0 if top == "__future__" else 1 if top in sys.stdlib_module_names else 3 if top in OURS else 2


def import_order_faults(text: str) -> list[str]:
    """What is out of order in the imports at the top of a module's `text`."""
    lines, faults, ours, groups = text.splitlines(), [], [], []
    for node in ast.parse(text).body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            if groups:
                break
            continue
        groups.append(_group(node))
        if groups[-1] == 3:
            if ours and any(not lines[i].strip() for i in range(ours[-1][1], node.lineno - 1)):
                faults.append(f"line {node.lineno}: a gap inside this project's imports")
            ours.append(((node.module or "") if isinstance(node, ast.ImportFrom) else node.names[0].name, node.end_lineno))
    if groups != sorted(groups):
        faults.append("groups out of order: __future__, standard library, third-party, this project's")
    names = [name for name, _ in ours]
    if names != sorted(names):
        faults.append(f"this project's imports not sorted: {names}")
    return faults


def test_every_module_groups_its_imports_the_same_way():
    modules = [path for folder in FOLDERS for path in (REPO / folder).rglob("*.py")] + [REPO / "stack.py", REPO / "__main__.py"]
    faults = {str(path.relative_to(REPO)): found for path in modules if (found := import_order_faults(path.read_text()))}
    assert not faults, faults


def test_the_check_sees_each_kind_of_disorder():
    assert import_order_faults("import os\n\nimport jax\n\nfrom trainer import a\nfrom trainer.b import c\n") == []
    assert import_order_faults("import jax\nimport os\n")  # third-party before the standard library
    assert import_order_faults("from trainer.run import step\nfrom trainer import export\n")  # unsorted
    assert import_order_faults("from trainer import export\n\nfrom trainer.run import step\n")  # a gap
