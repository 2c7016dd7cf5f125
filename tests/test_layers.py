"""Imports run one way: the trainer (the container) at the bottom, then the stack config and the TPU
catalog, then the infrastructure components and the workload builders beside each other, then the
program that joins them (stack.py, __main__.py). A module that imports upward, or across from the
workloads into the components or back, fails here with the offending line."""

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
# The stack config, the catalog and the pure builders both sides share: what both the components and
# the workload builders read.
CONFIG_LAYER = {"infra.accounts", "infra.config", "infra.errors", "infra.names", "infra.queues", "infra.stack_files", "infra.tpu"}
PROGRAM = {"stack", "__main__"}


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the file, at any depth (function-level imports too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _refused(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported`, or None."""
    top = imported.split(".")[0]
    if imported in PROGRAM or top == "stack":
        return "the program imports the layers, never the other way"
    if importer.startswith("trainer") and top in ("infra", "workloads"):
        return "the trainer runs in the container, alone: it imports nothing of the stack"
    if importer.startswith("infra") and top == "workloads":
        return "the infrastructure does not know the workloads; join them in stack.py"
    if importer.startswith("workloads") and top == "infra" and imported.count(".") >= 1:
        module = ".".join(imported.split(".")[:2])
        if module not in CONFIG_LAYER:
            return f"the workload builders read the stack config ({', '.join(sorted(CONFIG_LAYER))}), not infra components"
    return None


def layer_violations() -> list[str]:
    problems = []
    for package in ("trainer", "infra", "workloads"):
        for path in sorted((REPO / package).rglob("*.py")):
            importer = _module_name(path)
            for line, imported in _imports(path):
                why = _refused(importer, imported)
                if why:
                    problems.append(f"{path.relative_to(REPO)}:{line} imports {imported}: {why}")
    return problems


def test_imports_run_one_way():
    assert not layer_violations(), "\n".join(layer_violations())


def test_the_check_refuses_each_wrong_way():
    assert _refused("infra.platform", "workloads.deploy")
    assert _refused("workloads.manifests", "infra.identity")
    assert _refused("workloads.spec", "infra.cluster.CPU_POOL_NAME")
    assert _refused("trainer.loop", "infra.config")
    assert _refused("workloads.deploy", "stack")
    assert _refused("workloads.spec", "infra.config") is None and _refused("stack", "workloads.deploy") is None
