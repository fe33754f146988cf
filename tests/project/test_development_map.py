"""docs/development.md's map of rollstream's packages is written from what it describes, so it
cannot drift: the layers contract in pyproject.toml (which `make lint` enforces) gives the layers
and their order, and each package's docstring (or top-level module's) says what it holds.

After changing either, write the map again: `python -m tests.project.test_development_map`.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "development.md"
PACKAGE = ROOT / "rollstream"
BEGIN = "<!-- map: written by `python -m tests.project.test_development_map`; edit the sources -->"
END = "<!-- end of map -->"


def layers() -> list[tuple[list[str], bool]]:
    """The contract's layers, top first: (names, whether they import none of each other)."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"]
    [contract] = [c for c in contracts
                  if c["type"] == "layers" and c.get("containers") == ["rollstream"]]
    found = []
    for layer in contract["layers"]:
        independent = ":" not in layer
        found.append(([n.strip() for n in re.split(r"[|:]", layer)], independent))
    return found


def source(name: str) -> Path:
    package = PACKAGE / name / "__init__.py"
    return package if package.exists() else PACKAGE / f"{name}.py"


def summary(path: Path) -> str:
    """The docstring's first sentence, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    return re.split(r"(?<=\.)\s+(?=[A-Z`])", paragraph)[0]


def may_import(number: int, count: int, independent: bool) -> str:
    below = ("nothing in rollstream" if number == count else f"layer {count}"
             if number + 1 == count else f"layers {number + 1}-{count}")
    return below if independent else f"its own layer, {below}"


def render() -> str:
    rows = ["| layer | package | may import | what it holds |", "| --- | --- | --- | --- |"]
    found = layers()
    for number, (names, independent) in enumerate(found, start=1):
        allowed = may_import(number, len(found), independent or len(names) == 1)
        for name in names:
            path = source(name)
            shown = f"{name}/" if path.name == "__init__.py" else path.name
            target = f"../rollstream/{shown}"
            # A `|` inside a table cell, code spans too, ends the cell unless escaped.
            holds = summary(path).replace("|", "\\|")
            rows.append(f"| {number} | [`{shown}`]({target}) | {allowed} | {holds} |")
    return "\n".join([BEGIN, *rows, END])


def written() -> str:
    text = DOC.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def test_the_map_is_the_layers_contract_and_the_docstrings() -> None:
    assert written() == render(), (
        "docs/development.md's map is out of date: python -m tests.project.test_development_map")


def test_the_map_names_every_package_and_top_level_module() -> None:
    children = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()} | {
        p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    mapped = [name for names, _ in layers() for name in names]
    assert sorted(mapped) == sorted(children)
    assert all(f"[`{n}/`]" in written() or f"[`{n}.py`]" in written() for n in children)


def test_every_package_says_what_it_holds() -> None:
    """Every package at any depth, and every module at rollstream's top level, has a docstring
    whose first sentence the map can show."""
    paths = [*PACKAGE.rglob("__init__.py"), *(p for p in PACKAGE.glob("*.py"))]
    silent = [str(p.relative_to(ROOT)) for p in paths if len(summary(p)) < 12]
    assert silent == []


def test_what_a_layer_may_import() -> None:
    assert may_import(1, 13, True) == "layers 2-13"
    assert may_import(12, 13, True) == "layer 13"
    assert may_import(13, 13, True) == "nothing in rollstream"
    assert may_import(5, 13, False) == "its own layer, layers 6-13"


def test_the_summary_is_the_first_sentence(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""Talking to it: one `a|b` thing, and\nanother. Then more.\n\n'
                      'Details."""\n')
    assert summary(module) == "Talking to it: one `a|b` thing, and another."


if __name__ == "__main__":
    text = DOC.read_text()
    DOC.write_text(text.replace(written(), render()))
    print(f"wrote the map in {DOC.relative_to(ROOT)}")
