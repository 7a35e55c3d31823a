# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
# The CPU build on these machines; a GPU user can pick another, e.g. TORCH_SPEC="torch==2.13.0 --index-url ..."
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
# llama-cpp-python compiles llama.cpp for this CPU (pip keeps the wheel in its cache, so once per
# machine); the multimodal library is not needed and would double the build time.
export CMAKE_ARGS ?= -DLLAVA_BUILD=OFF

.PHONY: install demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/evospec demo

# Lint and formatting first (seconds), then the suite.
test: install
	$(BIN)/ruff check evospec tests benchmarks
	$(BIN)/ruff format --check evospec tests benchmarks
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info
