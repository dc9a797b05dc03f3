"""Project files agree: environment.yml installs what pyproject.toml declares, at the same versions."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent


#: pinned in environment.yml (and the Makefile) to the CPU build; pyproject only says what works.
PINNED_FOR_CPU = {"torch"}


def pyproject_requirements() -> dict[str, Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    lines = project["dependencies"] + [r for name in ("run", "lab", "test") for r in extras[name]]
    return {Requirement(r).name: Requirement(r) for r in lines}


def environment_requirements() -> dict[str, Requirement]:
    text = (REPO / "environment.yml").read_text()
    pip_section = text.split("- pip:", 1)[1]
    lines = re.findall(r"^\s+- (\S.*)$", pip_section, flags=re.M)
    return {Requirement(r).name: Requirement(r) for r in lines if not r.startswith("-e")}


def test_environment_yml_and_pyproject_name_the_same_dependencies():
    py, env = pyproject_requirements(), environment_requirements()
    assert sorted(py) == sorted(env)
    for name in set(py) - PINNED_FOR_CPU:
        assert str(py[name].specifier) == str(env[name].specifier), name
    assert str(env["torch"].specifier) == "==2.13.0"


def test_environment_installs_the_kit_with_its_extras():
    assert "- -e .[all]" in (REPO / "environment.yml").read_text()


def test_makefile_pins_the_same_torch_and_deepspeed_as_the_project():
    make = (REPO / "Makefile").read_text()
    assert re.search(r"^TORCH\s+\?=\s+torch==2\.13\.0$", make, flags=re.M)
    deepspeed = re.search(r"^DEEPSPEED\s+\?=\s+(\S+)$", make, flags=re.M).group(1)
    assert str(Requirement(deepspeed).specifier) == str(pyproject_requirements()["deepspeed"].specifier)
    assert str(pyproject_requirements()["deepspeed"].specifier) == "<0.20,>=0.19.8"
