# zero-kit: `make demo`, `make test`, `make lab`, `make bench`. Everything installs into .venv/.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# CPU build by default (it is what CI and laptops need). On a CUDA box:
#   make install TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

export OMP_NUM_THREADS ?= 1

.PHONY: install demo test lint unit notebooks bench lab clean

install: $(STAMP)

$(STAMP): pyproject.toml environment.yml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q deepspeed
	$(PY) -m pip install -q -e ".[all]"
	touch $(STAMP)

demo: install
	$(PY) -m kit demo --out runs/demo

lint: install
	$(VENV)/bin/ruff check kit tests
	$(VENV)/bin/ruff format --check kit tests

# The README's test command: lint, unit + 2-rank CPU integration tests, then every notebook.
test: lint
	ZEROKIT_SMOKE=1 $(PY) -m pytest -q tests
	ZEROKIT_SMOKE=1 $(PY) -m pytest -q --nbmake notebooks

bench: install
	$(PY) -m tests.bench

lab: install
	$(VENV)/bin/jupyter lab notebooks

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
