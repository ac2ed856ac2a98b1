# robo-pipe: `make demo` runs the demo, `make test` runs lint, type check and tests.
# Both set everything up first: Debian packages for headless rendering, a .venv with the
# pinned stack (torch CPU build first, then the rest under constraints.txt).

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup system-deps demo test lint typecheck bench clean lerobot-compat

setup: system-deps $(STAMP)

system-deps:
	@bash scripts/install_system_deps.sh

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# The CPU build of torch first: resolved later, torch would pull the CUDA build (GBs).
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

# The whole train-simulate-deploy pipeline on the embedded default (local Prefect, local Ray,
# MuJoCo, SQLite MLflow): collect, pretrain the base (cached after the first run), LoRA
# fine-tune, export, evaluate the export, latency gate, register; `champion` if every gate passes.
demo: setup
	$(BIN)/robo-pipe run configs/demo.yaml

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest

bench: setup
	$(BIN)/python benchmarks/sim_throughput.py --quick
	$(BIN)/python benchmarks/finetune.py --quick

clean:
	rm -rf $(VENV) .robo-pipe .pytest_cache .mypy_cache .ruff_cache

# LeRobot (for the dataset compatibility test) needs Python 3.12 and torchvision, so it lives in
# its own environment (~3 min, several GB: its torch is the CUDA build). Not part of `make test`.
LEROBOT_VENV ?= .venv-lerobot
# pyenv's python3.12 shim refuses to run unless 3.12 is selected, so prefer the interpreter itself.
LEROBOT_PY ?= $(or $(firstword $(wildcard $(shell pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12)),python3.12)

$(LEROBOT_VENV)/.installed:
	$(LEROBOT_PY) -m venv $(LEROBOT_VENV)
	$(LEROBOT_VENV)/bin/pip install --quiet 'lerobot[dataset]==0.6.1'
	@touch $@

lerobot-compat: setup $(LEROBOT_VENV)/.installed
	ROBO_PIPE_LEROBOT_PYTHON=$(LEROBOT_VENV)/bin/python $(BIN)/pytest tests/stages/test_collect.py -k lerobot -v
