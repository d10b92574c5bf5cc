# Every target creates .venv and installs what it needs on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export RAY_USAGE_STATS_ENABLED := 0
export PYTHONUNBUFFERED := 1

.PHONY: venv demo test bench lint clean image

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -U pip setuptools wheel
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[all,dev]" --config-settings editable_mode=compat
	touch $(STAMP)

demo: venv
	$(BIN)/python examples/demo.py

# pytest caches its rewritten test modules only where bytecode may be written: on a machine that
# sets PYTHONDONTWRITEBYTECODE every later run's workers rewrote every test module again (4 of
# each worker's 10 CPU s of collection)
test: venv
	$(BIN)/ruff check .
	$(BIN)/python -m compileall -q serving willump drift pipelines benchmarks examples tests
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n 3 --dist loadgroup --durations=20

bench: venv
	$(BIN)/python -m benchmarks.workloads

# the served pipeline as a container image (Dockerfile; needs docker)
IMAGE ?= willump-serve
image:
	docker build -t $(IMAGE) .

lint: venv
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
