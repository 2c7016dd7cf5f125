"""Imports run one way: the trainer (the container) at the bottom, then the stack config and the TPU
catalog, then the infrastructure components and the workload builders beside each other, then the
program that joins them (stack.py, __main__.py). Inside the trainer and inside infra, their own layers
run the same way (TRAINER_LAYERS, INFRA_LAYERS). A module that imports upward, or across from the
workloads into the components or back, fails here with the offending line; so does any import circle.
Every folder of infra/ and trainer/ says what it holds in its docstring and holds at most
MODULES_PER_FOLDER modules."""

import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
# The stack config, the catalog and the pure builders both sides share: what both the components and
# the workload builders read.
CONFIG_LAYER = {"infra.cloud.accounts", "infra.cloud.checkpointing", "infra.config", "infra.errors", "infra.catalog.names", "infra.queueing.queues", "infra.config.stack_files", "infra.catalog.tpu"}
PROGRAM = {"stack", "__main__"}
# The trainer's layers, lowest first: a module imports its own layer or lower ones. A name covers a
# module and, for a package, everything in it; "trainer" covers the package's __init__ alone. Each folder
# of trainer/ is one layer of its own, so folders import one way.
TRAINER_LAYERS = (
    ("what both sides read", ("trainer", "trainer.contract", "trainer.errors", "trainer.shared_files", "trainer.storage",
                              "trainer.run_identity")),
    ("the data side", ("trainer.data",)),
    ("the model's layers", ("trainer.nn",)),
    ("the architecture", ("trainer.gemma3",)),
    ("the options", ("trainer.config",)),
    ("Hugging Face formats", ("trainer.hf",)),
    ("the model's assembly", ("trainer.model",)),
    ("one run on the chips", ("trainer.run",)),
    ("GKE's multi-tier checkpointing", ("trainer.multitier",)),
    ("what a run costs", ("trainer.measure",)),
    ("what drives a model", ("trainer.loop", "trainer.generate", "trainer.export", "trainer.goodput_report", "trainer.supervise")),
    ("the entry point", ("trainer.__main__",)),
)


# infra's folders, lowest first: a module imports its own folder or a lower layer. Folders in one layer
# stand beside each other and import neither. "infra" covers the modules at infra/'s top.
INFRA_LAYERS = (
    ("the one error a config raises", ("infra.errors",)),
    ("the slice catalog and its names", ("infra.catalog",)),
    ("the stack config", ("infra.config",)),
    ("the cloud platform's components", ("infra.cloud",)),
    ("what runs wait in, and what the stack watches", ("infra.queueing", "infra.observability")),
    ("what joins them, and the program's tools", ("infra",)),
)
MODULES_PER_FOLDER = 12


ROOTS = ("trainer", "infra")


def _module_name(path: pathlib.Path, root: pathlib.Path = REPO) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path, root: pathlib.Path = REPO) -> list[tuple[int, str]]:
    """(line, module) of every import in the file, at any depth (function-level imports too); a relative
    import is read as the absolute name it stands for."""
    module = _module_name(path, root).split(".")
    package = module if path.name == "__init__.py" else module[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else [])) if node.level else node.module
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _covers(name: str, module: str) -> bool:
    """A root package's name covers its __init__ and, in infra, the plain modules at its top (and the names
    in them); any other name its module and everything under it."""
    if name in ROOTS:
        rest = module[len(name) + 1:] if module.startswith(name + ".") else None
        return module == name or (name == "infra" and rest is not None and (REPO / name / f"{rest.split('.')[0]}.py").is_file())
    return module == name or module.startswith(name + ".")


def _layer(module: str, layers: tuple, table: str) -> tuple[int, str]:
    """The index in `layers` of the most specific name that covers `module`, and that name."""
    covering = [(len(name), index, name) for index, (_, names) in enumerate(layers) for name in names
                if _covers(name, module)]
    if not covering:
        raise AssertionError(f"{module} is in no layer of tests/test_layers.py's {table}: place it there")
    _, index, name = max(covering)
    return index, name


def trainer_layer(module: str) -> int:
    return _layer(module, TRAINER_LAYERS, "TRAINER_LAYERS")[0]


def _refused_in_infra(importer: str, imported: str) -> str | None:
    (mine, my_folder), (theirs, their_folder) = (_layer(importer, INFRA_LAYERS, "INFRA_LAYERS"),
                                                 _layer(imported, INFRA_LAYERS, "INFRA_LAYERS"))
    if theirs > mine:
        return f"upward in infra: {INFRA_LAYERS[mine][0]} may not import {INFRA_LAYERS[theirs][0]}"
    if theirs == mine and my_folder != their_folder:
        return f"across infra: {my_folder} and {their_folder} stand beside each other and import neither"
    return None


def _refused(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported`, or None."""
    top = imported.split(".")[0]
    if importer.startswith("trainer") and top == "trainer":
        mine, theirs = trainer_layer(importer), trainer_layer(imported)
        if theirs > mine:
            return f"upward in the trainer: {TRAINER_LAYERS[mine][0]} may not import {TRAINER_LAYERS[theirs][0]}"
    if importer.startswith("infra") and top == "infra":
        return _refused_in_infra(importer, imported)
    if imported in PROGRAM or top == "stack":
        return "the program imports the layers, never the other way"
    if importer.startswith("trainer") and top in ("infra", "workloads"):
        return "the trainer runs in the container, alone: it imports nothing of the stack"
    if importer.startswith("infra") and top == "workloads":
        return "the infrastructure does not know the workloads; join them in stack.py"
    if importer.startswith("workloads") and top == "infra" and imported.count(".") >= 1:
        if not any(imported == name or imported.startswith(name + ".") for name in CONFIG_LAYER):
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


def test_every_infra_module_has_a_layer():
    for path in sorted((REPO / "infra").rglob("*.py")):
        _layer(_module_name(path), INFRA_LAYERS, "INFRA_LAYERS")


def _folders(root: pathlib.Path = REPO) -> list[pathlib.Path]:
    """Every folder of infra/ and trainer/ that holds Python, with an __init__.py or not."""
    return sorted({path.parent for package in ROOTS for path in (root / package).rglob("*.py") if "__pycache__" not in path.parts})


def _undocumented(folders: list[pathlib.Path]) -> list[str]:
    return [folder.name for folder in folders
            if not (folder / "__init__.py").is_file() or not ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))]


def test_every_folder_says_what_it_holds():
    undocumented = [str(folder.relative_to(REPO)) for folder in _folders() if _undocumented([folder])]
    assert not undocumented, f"folders without a docstring in __init__.py (what it holds, what it may import): {undocumented}"


def test_no_folder_holds_more_than_a_dozen_modules():
    crowded = {str(folder.relative_to(REPO)): count for folder in _folders()
               if (count := len([path for path in folder.glob("*.py") if path.name != "__init__.py"])) > MODULES_PER_FOLDER}
    assert not crowded, f"folders over {MODULES_PER_FOLDER} modules: {crowded}: split them by concern"


def test_the_checks_see_what_could_escape_them(tmp_path):
    # A module no layer lists is refused, not placed in the root package's layer.
    with pytest.raises(AssertionError, match="in no layer"):
        trainer_layer("trainer.newfolder.module")
    with pytest.raises(AssertionError, match="in no layer"):
        _layer("infra.newfolder.module", INFRA_LAYERS, "INFRA_LAYERS")
    assert _layer("infra.platform", INFRA_LAYERS, "INFRA_LAYERS")[1] == "infra"
    # A relative import is read as the module it names.
    module = tmp_path / "trainer" / "nn" / "layers.py"
    module.parent.mkdir(parents=True)
    module.write_text("from ..run import step\nfrom . import loss\n")
    assert [name for _, name in _imports(module, tmp_path)] == ["trainer.run.step", "trainer.nn.loss"]
    # A folder without __init__.py is still a folder, and an undocumented one.
    (tmp_path / "trainer" / "loose").mkdir()
    (tmp_path / "trainer" / "loose" / "a.py").write_text("")
    folders = _folders(tmp_path)
    assert tmp_path / "trainer" / "loose" in folders and "loose" in _undocumented(folders)


def test_trainer_folders_import_one_way():
    """Each folder of trainer/ is a layer of its own: no two folders import each other."""
    folders = {path.parent.name for path in (REPO / "trainer").glob("*/__init__.py")}
    assert folders <= {name.split(".")[1] for _, names in TRAINER_LAYERS for name in names if name.count(".") == 1}, \
        "a trainer folder has no layer of its own in TRAINER_LAYERS"
    for _, names in TRAINER_LAYERS:
        assert len([name for name in names if name.split(".")[-1] in folders]) <= 1, f"two folders share a layer: {names}"


def test_the_check_refuses_each_wrong_way():
    assert _refused("infra.platform", "workloads.deploy")
    assert _refused("workloads.manifests", "infra.cloud.identity")
    assert _refused("workloads.spec", "infra.cloud.cluster.CPU_POOL_NAME")
    assert _refused("trainer.loop", "infra.config")
    assert _refused("workloads.deploy", "stack")
    assert _refused("workloads.spec", "infra.config") is None and _refused("stack", "workloads.deploy") is None
    assert _refused("trainer.data.prepare", "trainer.model.models.init_params")
    assert _refused("trainer.model.models", "trainer.loop")
    assert _refused("trainer.nn.layers", "trainer.run.mesh") and _refused("trainer.nn.layers", "trainer.gemma3.model")
    assert _refused("trainer.hf.load", "trainer.model.models") and _refused("trainer.gemma3.model", "trainer.model.models")
    assert _refused("trainer.model.models", "trainer.hf.load") is None and _refused("trainer.run.step", "trainer.model.models") is None
    assert _refused("trainer.export", "trainer.loop") is None and _refused("trainer.loop", "trainer.data.loader") is None
    assert _refused("infra.catalog.tpu", "infra.config.StackConfig")
    assert _refused("infra.cloud.cluster", "infra.observability.telemetry")
    assert _refused("infra.queueing.kueue", "infra.observability.monitoring")
    assert _refused("infra.observability.dashboard", "infra.platform")
    assert _refused("infra.observability.monitoring", "infra.cloud.component.Component") is None
    assert _refused("infra.platform", "infra.queueing.kueue") is None


def test_the_circle_check_finds_a_circle():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []
