# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
# The CPU build on these machines; a GPU user can pick another, e.g. TORCH_SPEC="torch==2.13.0 --index-url ..."
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
# llama-cpp-python compiles llama.cpp for this CPU (pip keeps the wheel in its cache, so once per
# machine); the multimodal library and llama.cpp's common library are not needed and would double the
# build time (cmake/llama-cpp-python-lean.cmake says how the second is left out).
# llama.cpp's AMX kernels crash in ggml_backend_amx_mul_mat on Sapphire Rapids (ggml-org/llama.cpp#20824,
# unfixed in 0.3.36), so on a CPU with AMX it is built for that CPU's AVX-512 set instead of -march=native.
CPU_FLAGS := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
ifneq ($(filter amx_int8,$(CPU_FLAGS)),)
LLAMA_ISA := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
	-DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
endif
export CMAKE_ARGS ?= -DLLAVA_BUILD=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE=$(CURDIR)/cmake/llama-cpp-python-lean.cmake $(LLAMA_ISA)

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
