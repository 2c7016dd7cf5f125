"""Imports run one way: the trainer (the container) at the bottom, then the stack config and the TPU
catalog, then the infrastructure components and the workload builders beside each other, then the
program that joins them (stack.py, __main__.py). Inside the trainer, its own layers run the same way
(TRAINER_LAYERS). A module that imports upward, or across from the workloads into the components or
back, fails here with the offending line; so does any import circle."""

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
# The stack config, the catalog and the pure builders both sides share: what both the components and
# the workload builders read.
CONFIG_LAYER = {"infra.accounts", "infra.config", "infra.errors", "infra.names", "infra.queues", "infra.stack_files", "infra.tpu"}
PROGRAM = {"stack", "__main__"}
# The trainer's layers, lowest first: a module imports its own layer or lower ones. A name covers a
# module and, for a package, everything in it.
TRAINER_LAYERS = (
    ("what both sides read", ("trainer", "trainer.contract", "trainer.errors", "trainer.shared_files")),
    ("the data side", ("trainer.data",)),
    ("the options", ("trainer.config", "trainer.gemma3.config")),
    ("the parts of a run", ("trainer.checkpoint", "trainer.params_io", "trainer.hbm", "trainer.metrics", "trainer.precision", "trainer.preemption",
                            "trainer.measure.flops", "trainer.measure.hardware", "trainer.measure.throughput",
                            "trainer.hf.config", "trainer.hf.weights", "trainer.hf.tokenizer",
                            "trainer.hf.tokenizer_json", "trainer.hf.sample", "trainer.hf.publish")),
    ("the model and its step", ("trainer.gemma3", "trainer.models", "trainer.layers", "trainer.loss", "trainer.mesh", "trainer.step", "trainer.vocab_chunk", "trainer.sampling",
                                "trainer.measure.plot")),
    ("what drives a model", ("trainer.loop", "trainer.generate", "trainer.hf.export", "trainer.measure")),
    ("the entry point", ("trainer.__main__",)),
)


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


def trainer_layer(module: str) -> int:
    """The index in TRAINER_LAYERS of the most specific name that covers `module`."""
    covering = [(len(name), index) for index, (_, names) in enumerate(TRAINER_LAYERS) for name in names
                if module == name or module.startswith(name + ".")]
    if not covering:
        raise AssertionError(f"{module} is in no layer of tests/test_layers.py's TRAINER_LAYERS: place it there")
    return max(covering)[1]


def _refused(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported`, or None."""
    top = imported.split(".")[0]
    if importer.startswith("trainer") and top == "trainer":
        mine, theirs = trainer_layer(importer), trainer_layer(imported)
        if theirs > mine:
            return f"upward in the trainer: {TRAINER_LAYERS[mine][0]} may not import {TRAINER_LAYERS[theirs][0]}"
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


def _import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (an imported name resolves to its module)."""
    paths = {_module_name(path): path for package in ("trainer", "infra", "workloads", "bench", "policy")
             for path in (REPO / package).rglob("*.py")}
    paths |= {_module_name(path): path for path in REPO.glob("*.py")}
    graph = {}
    for module, path in paths.items():
        targets = set()
        for _, imported in _imports(path):
            parts = imported.split(".")
            found = next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in paths), None)
            if found and found != module and not module.startswith(found + "."):  # a package's own __init__ is no circle
                targets.add(found)
        graph[module] = targets
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle of imports, found by depth-first search, each as the path that closes it."""
    circles, done, path = [], set(), []

    def visit(module: str) -> None:
        if module in path:
            circles.append(path[path.index(module):] + [module])
            return
        if module in done:
            return
        path.append(module)
        for imported in sorted(graph.get(module, ())):
            visit(imported)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
    return circles


def test_no_import_circle():
    circles = import_circles(_import_graph())
    assert not circles, "import circles (function-level imports count):\n" + "\n".join(" -> ".join(c) for c in circles)


def test_every_trainer_module_has_a_layer():
    for path in sorted((REPO / "trainer").rglob("*.py")):
        trainer_layer(_module_name(path))


def test_the_check_refuses_each_wrong_way():
    assert _refused("infra.platform", "workloads.deploy")
    assert _refused("workloads.manifests", "infra.identity")
    assert _refused("workloads.spec", "infra.cluster.CPU_POOL_NAME")
    assert _refused("trainer.loop", "infra.config")
    assert _refused("workloads.deploy", "stack")
    assert _refused("workloads.spec", "infra.config") is None and _refused("stack", "workloads.deploy") is None
    assert _refused("trainer.data.prepare", "trainer.models.init_params")
    assert _refused("trainer.models", "trainer.loop")
    assert _refused("trainer.hf.export", "trainer.loop") is None and _refused("trainer.loop", "trainer.data.loader") is None


def test_the_circle_check_finds_a_circle():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []
