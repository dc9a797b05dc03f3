"""The package's layout holds (docs/architecture.md, "Module map"): rooms import only the rooms below
them, no import cycles (module-level or inside functions), estimating never imports torch or deepspeed,
and a wheel installed outside the repository works on its own."""

import ast
import graphlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KIT = REPO / "kit"

#: what each room may import (besides itself); "kit" is the torch-free core, kit/*.py
ROOMS = {
    "kit": set(),
    "kit.workloads": {"kit"},
    "kit.estimate": {"kit", "kit.workloads"},
    "kit.steptime": {"kit", "kit.estimate"},
    "kit.planning": {"kit", "kit.estimate", "kit.steptime"},
    "kit.review": {"kit", "kit.estimate", "kit.steptime"},
    "kit.accuracy": {"kit", "kit.estimate", "kit.steptime", "kit.planning"},
    "kit.run": {"kit", "kit.estimate", "kit.steptime", "kit.workloads"},
    "kit.scaleout": {"kit", "kit.estimate", "kit.steptime", "kit.run"},
    "kit.ranks": {"kit", "kit.workloads", "kit.estimate", "kit.steptime", "kit.scaleout"},
    "kit.lab": {
        "kit",
        "kit.estimate",
        "kit.steptime",
        "kit.planning",
        "kit.review",
        "kit.accuracy",
        "kit.run",
        "kit.scaleout",
    },  # fmt: skip
}
#: the CLI shows everything the notebooks' panels do
ROOMS["kit.cli"] = ROOMS["kit.lab"] | {"kit.lab"}


#: packages inside a room, part of it: the core's ds_config (writer, reader, parser), the lab's teach (topics)
NESTED = {"kit.ds_config": "kit", "kit.lab.teach": "kit.lab"}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(KIT.rglob("*.py"))}


def imports(name: str) -> set[str]:
    """The kit modules ``name`` imports anywhere in its file (top level or inside a function)."""
    path = MODULES[name]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pytest.fail(f"{name}: relative import; the kit imports absolutely")
            targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module or ""]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target.startswith("kit") and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


def room(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and f"kit.{parts[1]}" in ROOMS else "kit"


def test_the_rooms_are_the_subpackages():
    packages = {module_name(p.parent / "__init__.py") for p in KIT.rglob("__init__.py")}
    assert packages == set(ROOMS) | set(NESTED)
    assert {name: room(name) for name in NESTED} == NESTED
    # and the wheel ships each of them (pyproject's explicit package list)
    shipped = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert packages <= set(shipped)


def test_no_import_cycles():
    graph = {name: imports(name) for name in MODULES}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        pytest.fail(f"import cycle: {' -> '.join(error.args[1])}")


def test_each_room_imports_only_the_rooms_below_it():
    wrong = {
        f"{name} imports {target}"
        for name in MODULES
        if name not in ("kit", "kit.__main__")  # the package's face and ``python -m kit``
        for target in imports(name)
        if room(target) != room(name) and room(target) not in ROOMS[room(name)]
    }
    assert wrong == set()


def test_estimating_never_imports_torch_or_deepspeed():
    code = """
import io, json, sys
from contextlib import redirect_stdout
import kit, kit.estimate, kit.steptime.perf, kit.planning.plan, kit.estimate.checkpoint_size, kit.ds_config
from kit.cli import main
out = io.StringIO()
with redirect_stdout(out):
    codes = [main(["estimate", "--model", "llama-2-7b", "--json"]), main(["plan", "--model", "llama-2-7b"])]
heavy = sorted(m for m in ("torch", "deepspeed", "transformers") if m in sys.modules)
print(json.dumps({"codes": codes, "heavy": heavy}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert json.loads(done.stdout.splitlines()[-1]) == {"codes": [0, 0], "heavy": []}


def test_a_wheel_installed_outside_the_repo_answers_estimate(tmp_path):
    """``pip install`` of the built wheel (not editable) into a fresh virtualenv; run from another folder,
    ``zerokit estimate`` finds the presets and the GPU table inside the installed package."""
    source = tmp_path / "source"
    shutil.copytree(
        REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "runs", "build", "*.egg-info")
    )
    dist = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run([*pip, "wheel", str(source), "--no-deps", "--no-build-isolation", "-w", dist], check=True)
    (wheel,) = dist.glob("zero_kit-*.whl")
    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=False)
    python = fresh / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(subprocess.check_output([python, "-c", purelib], text=True).strip())
    # the kit's dependencies come from this environment, appended after the fresh venv's own packages
    ours = [p for p in sys.path if p.endswith("site-packages")]
    (site / "deps.pth").write_text("\n".join(ours) + "\n")
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", str(wheel)], check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run(
        [python, "-c", "import kit.paths as p; print(p.PACKAGE); print(p.DATA)"],
        capture_output=True, text=True, check=True, cwd=elsewhere, env=env,
    )  # fmt: skip
    package, data = map(Path, where.stdout.split())
    assert package == site / "kit" and data == site / "kit" / "data"
    assert sorted(p.name for p in (data / "models").glob("*.json")) == sorted(
        p.name for p in (REPO / "data" / "models").glob("*.json")
    )
    ours = REPO / "data"
    published = [p.relative_to(ours) for p in (ours / "published").rglob("*") if p.is_file()]
    assert published and all((data / p).read_bytes() == (ours / p).read_bytes() for p in published)
    done = subprocess.run(
        [fresh / "bin" / "zerokit", "estimate", "--model", "llama-2-7b", "--stage", "3", "--json"],
        capture_output=True, text=True, cwd=elsewhere, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    from kit import models
    from kit.estimate import estimate
    from kit.schema import Setup

    here = estimate(Setup(model=models.preset("llama-2-7b"), zero={"stage": 3}, batch={}))
    assert json.loads(done.stdout)["per_gpu_bytes"] == here.per_gpu_bytes
    # the published runs and their models' configs are found inside the installed package (A18's GPT is
    # data/published/models/megatron-gpt-18b.json; every row is tests/test_published.py's)
    done = subprocess.run(
        [fresh / "bin" / "zerokit", "published", "--id", "A18", "--json"],
        capture_output=True, text=True, cwd=elsewhere, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["rows"]
    assert row["setup"]["model"]["name"] == "megatron-gpt-18b" and row["reason"] is None
    assert all(v["predicted_bytes"] > 0 for v in row["values"])


def test_the_architecture_page_maps_every_module():
    page = (REPO / "docs" / "architecture.md").read_text()
    missing = [
        name
        for name, path in MODULES.items()
        if path.name not in ("__init__.py", "__main__.py") and f"`{path.name}`" not in page
    ]
    assert missing == []
    assert all(f"`{name}`" in page for name in ROOMS)
