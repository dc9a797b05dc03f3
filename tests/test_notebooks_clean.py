"""Every notebook is committed clean: no outputs, a `parameters` first code cell, data resolved by the kit."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK_FILES = sorted((REPO / "notebooks").glob("*.ipynb"))
#: a relative path into the repository's data/ (the kit resolves data/ from the package instead)
RELATIVE_DATA = re.compile(r"""(\.\./|\./|["'])data(/|["'])""")


def test_relative_data_pattern():
    for bad in ('open("../data/gpus.csv")', "Path('data') / 'gpus.csv'", 'pd.read_csv("data/gpus.csv")'):
        assert RELATIVE_DATA.search(bad), bad
    for good in ("from kit.paths import DATA", 'DATA / "gpus.csv"', 'models.resolve("llama-2-7b")'):
        assert not RELATIVE_DATA.search(good), good


def test_notebooks_are_numbered_without_gaps_and_each_is_in_the_readme():
    numbers = [int(p.name[:2]) for p in NOTEBOOK_FILES]
    assert len(numbers) >= 7 and numbers == list(range(len(numbers))), [p.name for p in NOTEBOOK_FILES]
    readme = (REPO / "README.md").read_text()
    assert [p.stem for p in NOTEBOOK_FILES if f"`{p.stem}`" not in readme] == []


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda p: p.name)
def test_no_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert dirty == [], f"{path.name}: cells {dirty} have outputs or execution counts; clear them"


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda p: p.name)
def test_first_code_cell_is_parameters(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{path.name}: no code cells"
    assert "parameters" in code[0].metadata.get("tags", []), f"{path.name}: first code cell lacks the tag"
    assert 'os.environ.get("ZEROKIT_SMOKE") == "1"' in code[0].source, f"{path.name}: no smoke defaults"


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda p: p.name)
def test_goal_stated_at_top(path):
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# "), f"{path.name}: no title"
    assert "goal" in first.source.lower(), f"{path.name}: the first cell does not state the goal"


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda p: p.name)
def test_data_resolved_from_the_package(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not RELATIVE_DATA.search(cell.source), (
                f"{path.name}: relative data/ path in {cell.source!r}"
            )


def test_onboarding_points_to_every_other_notebook():
    nb = nbformat.read(NOTEBOOK_FILES[0], as_version=4)
    (what_next,) = [c.source for c in nb.cells if c.source.startswith("## What next")]
    for path in NOTEBOOK_FILES[1:]:
        assert f"**{path.name[:2]} · " in what_next, f"00's 'What next' does not list {path.name}"
