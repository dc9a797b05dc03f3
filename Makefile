# zero-kit: `make demo`, `make test`, `make lab`, `make bench`. Everything installs into .venv/.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# torch 2.13.0 from the index pip is set up with. On the public index that is the CUDA build on Linux
# (several GB); machines whose pip points at a CPU-only mirror (this project's CI) get the CPU build.
# For the CPU-only build from PyTorch's own index: make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH       ?= torch==2.13.0
TORCH_INDEX ?=
# The range the state walk and engine teardown are checked against (kit/ranks/state_walk.py reads
# DeepSpeed's internals); keep in step with pyproject.toml and environment.yml.
DEEPSPEED   ?= deepspeed>=0.19.8,<0.20
STAMP  := $(VENV)/.installed
ENGINE := $(VENV)/.deepspeed

export OMP_NUM_THREADS ?= 1
# DeepSpeed's JIT-built ops (async_io for NVMe offload) in this venv, not ~/.cache/torch_extensions: their
# build commands name the venv's absolute paths, so checkouts sharing one folder rebuild each other's copy
export TORCH_EXTENSIONS_DIR ?= $(abspath $(VENV))/torch_extensions

.PHONY: install demo test e2e chromium libaio lint bench lab gpu-reference clean

install: $(STAMP)

# torch and DeepSpeed first (make test starts DeepSpeed's async_io build once they are in), then the kit
$(ENGINE): pyproject.toml environment.yml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install -q "$(DEEPSPEED)"
	touch $(ENGINE)

$(STAMP): $(ENGINE)
	$(PY) -m pip install -q -e ".[all]"
	touch $(STAMP)

# the folder make demo writes (tests/test_demo.py runs make demo into a temporary one)
DEMO_OUT ?= runs/demo
demo: install
	$(PY) -m kit demo --out $(DEMO_OUT)

lint: install
	$(VENV)/bin/ruff check kit tests
	$(VENV)/bin/ruff format --check kit tests
	$(VENV)/bin/mypy

# The README's test command: lint; the unit tests in two processes (pytest-xdist); the tests that launch
# processes (marked distributed: 2-rank CPU runs, timed process groups) one at a time; then the notebooks,
# two at a time (a kernel waits on its ranks much of the time: 256 -> 145 s on 2 cores). One pass of two
# processes over everything (xdist loadscope) was tried: slower on a fresh clone (15:40 in all), its
# launches and the async_io build oversubscribing the cores.
# The launching passes print their slowest tests (--durations).
# DeepSpeed's async_io op the NVMe tests need (about 320 CPU-s of g++) builds in the background from as soon
# as DeepSpeed is installed, while the kit installs and lint runs; the tests start once it is built (the
# second tests.build_async_io waits on torch's build lock, then loads it). Built beside the tests instead,
# it cost the launching pass about 140 s and made its time depend on the build's (log in the venv).
# Notebook 08 times ranks (a calibration, then tune's runs): 36-49 s alone, 325-335 s beside another
# notebook's ranks on 2 cores, so it runs alone, before the others run two at a time.
ALONE := notebooks/08_plan_the_booking.ipynb
test: libaio $(ENGINE)
	nice -n 19 $(PY) -m tests.build_async_io > $(VENV)/async_io_build.log 2>&1 &
	$(MAKE) --no-print-directory install lint
	$(PY) -m tests.build_async_io
	ZEROKIT_SMOKE=1 $(PY) -m pytest -q -n 2 -m "not distributed and not e2e" tests
	ZEROKIT_SMOKE=1 $(PY) -m pytest -q --durations=15 -m "distributed and not e2e" tests
	ZEROKIT_SMOKE=1 $(PY) -m pytest -q --nbmake $(ALONE)
	ZEROKIT_SMOKE=1 $(PY) -m pytest -q --durations=11 -n 2 --nbmake notebooks --ignore=$(ALONE)

# The notebooks as a user meets them: JupyterLab in headless Chromium (tests/e2e), every notebook run,
# both panels clicked, a run stopped; screenshots to docs/screenshots/. The browser is Debian's chromium
# package (Playwright's own browser downloads are never used).
CHROMIUM ?= /usr/bin/chromium
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
e2e: install chromium
	ZEROKIT_CHROMIUM=$(CHROMIUM) $(PY) -m pytest -q -m e2e tests/e2e

chromium:
	@test -x $(CHROMIUM) || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium; }

# NVMe offload (ZeRO-Infinity) runs need DeepSpeed's async_io op, JIT-built against Debian's libaio-dev
# (the first NVMe launch builds it, about 320 CPU-seconds: 3-10 minutes on 2 cores; kept in
# $(TORCH_EXTENSIONS_DIR) under make, else in ~/.cache/torch_extensions).
libaio:
	@test -e /usr/include/libaio.h || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq libaio-dev; }

bench: install
	$(PY) -m tests.bench

# On a GPU machine: the stage sweep on a ~1.5B model (GPT-2 XL's shape), records kept in data/reference/;
# then rank 0 of 64 and 32 ranks on one GPU, the caching allocator's traces (kit.accuracy.traces).
GPUS ?= 1
gpu-reference: install
	$(PY) -m kit run --model gpt2-xl --stages 0,1,2,3 --offload-optimizer none,cpu --micro-batch 4 \
		--nprocs $(GPUS) --steps 10 --sweep gpu-$(GPUS)x --runs-dir data/reference --no-progress
	$(PY) -m kit run --model qwen2.5-0.5b --stages 0,3 --micro-batch 4 --seq-len 2048 \
		--nprocs $(GPUS) --steps 6 --sweep gpu-$(GPUS)x-qwen --runs-dir data/reference --no-progress
	$(PY) -m tests.fixtures.allocator_trace --out data/reference/allocator-traces

# JupyterLab as make e2e tests it (kit.lab.server: without a GPU its kernels get DS_ACCELERATOR=cpu)
lab: install
	$(PY) -m kit.lab.server notebooks

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
