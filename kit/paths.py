"""Where the kit's data lives: inside the installed package (``kit/data``, the wheel's package data) or,
in a source checkout, the repository's top-level ``data/`` folder. Never the working directory."""

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
#: the folder holding the ``kit`` package: what ranks need on PYTHONPATH
PACKAGE_PARENT = PACKAGE.parent
DATA = PACKAGE / "data" if (PACKAGE / "data").is_dir() else PACKAGE_PARENT / "data"
MODELS = DATA / "models"
REFERENCE = DATA / "reference"
EXAMPLES = DATA / "examples"
#: published measurements of real GPU runs, the test set of the GPU-side predictions (kit.accuracy.published)
PUBLISHED = DATA / "published"
