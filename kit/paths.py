"""Where the kit's files live, resolved from the package (never from the working directory)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
MODELS = DATA / "models"
REFERENCE = DATA / "reference"
NOTEBOOKS = ROOT / "notebooks"
