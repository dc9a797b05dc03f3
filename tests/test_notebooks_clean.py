"""Every notebook is committed clean: no outputs, a `parameters` first code cell, data resolved by the kit."""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK_FILES = sorted((REPO / "notebooks").glob("*.ipynb"))
DATA = (REPO / "data").resolve()


def data_paths(source: str) -> list[str]:
    """The string literals of a code cell (IPython's own translation of its magics, parsed by ``ast``)
    that reach into the repository's data/ when opened from notebooks/ or from the repository root (the
    kit resolves data/ from the package instead)."""
    tree = ast.parse(TransformerManager().transform_cell(source))
    bases = (REPO / "notebooks", REPO)
    texts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return [t for t in texts if "\0" not in t and any((b / t).resolve().is_relative_to(DATA) for b in bases)]


def test_data_paths_finds_relative_paths_into_data():
    for bad in ('open("../data/gpus.csv")', "Path('data') / 'gpus.csv'", 'pd.read_csv("data/gpus.csv")'):
        assert data_paths(bad), bad
    good = (
        "from kit.paths import DATA",
        'DATA / "gpus.csv"',
        'models.resolve("llama-2-7b")',
        "%matplotlib inline",
    )
    for source in good:
        assert data_paths(source) == [], source


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
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert data_paths(cell.source) == [], f"{path.name}: cell {i} opens data/ by a relative path"


def test_onboarding_points_to_every_other_notebook():
    nb = nbformat.read(NOTEBOOK_FILES[0], as_version=4)
    (what_next,) = [c.source for c in nb.cells if c.source.startswith("## What next")]
    for path in NOTEBOOK_FILES[1:]:
        assert f"**{path.name[:2]} · " in what_next, f"00's 'What next' does not list {path.name}"
