"""docs/architecture.md's layout names every module of the project, and only modules that exist."""

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("infra", "workloads", "trainer")


def _layout_block() -> list[str]:
    text = (REPO / "docs" / "architecture.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    return block.splitlines()


def documented_modules() -> set[str]:
    """Paths named in the layout: the `name.py` (or `subpackage/name.py`) words a line starts with (its
    description follows), under the `package/` line above it, or at the top for an unindented line."""
    found, package = set(), ""
    for line in _layout_block():
        if re.fullmatch(r"[a-z_]+/", line.strip()) and not line.startswith(" "):
            package = line.strip()
            continue
        if line and not line.startswith(" "):
            package = ""
        for word in line.split():
            if not re.fullmatch(r"([a-z0-9_]+/)?[a-z0-9_]+\.py", word) or ("/" in word and not package):
                break
            found.add(package + word)
    return found


def actual_modules() -> set[str]:
    modules = {path.name for path in REPO.glob("*.py")}
    for package in PACKAGES:
        modules |= {f"{package}/{path.relative_to(REPO / package)}" for path in (REPO / package).rglob("*.py")
                    if path.name != "__init__.py"}
    return modules


def test_the_layout_names_every_module_and_no_other():
    documented, actual = documented_modules(), actual_modules()
    assert not actual - documented, f"not in docs/architecture.md's layout: {sorted(actual - documented)}"
    assert not documented - actual, f"in docs/architecture.md's layout but not in the repository: {sorted(documented - actual)}"
