# robo-pipe: `make quickstart` runs the quick start (about 2 min), `make demo` the demo,
# `make test` lint, type check and tests.
# Both set everything up first: Debian packages for headless rendering, a .venv with the
# pinned stack (torch CPU build first, then the rest under constraints.txt).

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup system-deps quickstart demo test test-each-file lint typecheck bench clean lerobot-env lerobot-compat mutation isaaclab-env metaworld-env

setup: system-deps $(STAMP)

system-deps:
	@bash scripts/install_system_deps.sh

# uv installs the pinned stack (constraints.txt) into the venv: ~40 s on 2 cores where pip took
# ~90 s (parallel unpacking and byte-compiling, and a shared cache in ~/.cache/uv). Byte-compile
# what it installs: where PYTHONDONTWRITEBYTECODE is set (this machine's environment sets it) no
# import writes a .pyc, so without them every process compiled every module it imported, every
# time (the suite ran ~3x slower). uv does not read pip's configuration: pip's find-links (where
# this machine keeps the CPU build of torch; from PyPI torch would pull the CUDA build, GBs) are
# handed to it.
UV_VERSION := 0.13.9
PIP_LINKS := $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet 'uv==$(UV_VERSION)'
	$(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode \
		$(foreach links,$(PIP_LINKS),--find-links $(links)) \
		-c constraints.txt torch==2.13.0 -e '.[dev,ros]'
	@touch $(STAMP)

# The quick start: the whole pipeline on an easier task (one object to touch), deployed onto a
# local edge agent in about 2 minutes on 2 cores, every gate passed honestly (configs/quickstart.yaml).
quickstart: setup
	$(BIN)/robo-pipe run --config configs/quickstart.yaml

# The whole train-simulate-deploy pipeline on the embedded default (local Prefect, local Ray,
# MuJoCo, SQLite MLflow): collect, pretrain the base (cached after the first run), LoRA
# fine-tune, export, evaluate the export, latency gate, register; `champion` if every gate passes.
demo: setup
	$(BIN)/robo-pipe run --config configs/demo.yaml

# deptry ([tool.deptry] in pyproject.toml): every import is a declared dependency.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/deptry .

# mypy's cache is the machine's, shared by every clone (~/.cache/robo-pipe, as the environments
# are): a cold mypy took ~80 s of one core on 2 cores, a fresh clone on the shared cache ~4 s.
# Where a file's path or mtime differs from the cache's, mypy compares its hash, so a clone
# never reuses another's results for code that differs. Two clones' mypys take turns (flock):
# the cache is SQLite, and a writer waiting past its timeout would fail the check.
MYPY_CACHE ?= $(HOME)/.cache/robo-pipe/mypy
MYPY = mkdir -p $(MYPY_CACHE) && MYPY_CACHE_DIR=$(MYPY_CACHE) flock $(MYPY_CACHE).lock $(BIN)/mypy
typecheck: setup
	$(MYPY)

# LeRobot's own reader checks a freshly collected dataset in every test run, and the Isaac Lab
# backend and Meta-World run on CPU (tests marked isaaclab, metaworld); `make test` builds the
# three environments (once per machine) and names them, so those tests fail (never skip) when
# an environment is missing.
#
# Two pytest-xdist workers, each test file on one worker (a module's fixtures, its Prefect server
# and home, are shared by its tests): on 2 cores the suite took 55 min in one process, which
# kept one core busy, and 38 min in two (issue 49); 28.5 min once xdist kept the slowest files
# first. Three workers were measured slower still (40.8 min: load 5-9 on 2 cores, one time bound
# over). TEST_WORKERS=0 runs it in this process.
#
# The type check (~4 s on the shared cache; a cold one ~80 s of one core) runs beside the tests, not before them: run
# first, it left the second core idle for that minute, and the suite's tests that wait on
# servers, schedules and subprocesses leave gaps it fills. Its output follows the tests';
# either failing fails.
TEST_WORKERS ?= 2
test: lint lerobot-env isaaclab-env metaworld-env
	@($(MYPY)) > $(VENV)/mypy.log 2>&1 & types=$$!; \
	trap 'pkill -P $$types 2>/dev/null; kill $$types 2>/dev/null' INT TERM EXIT; \
	ROBO_PIPE_LEROBOT_PYTHON=$(LEROBOT_VENV)/bin/python \
	ROBO_PIPE_ISAACLAB_PYTHON=$(ISAACLAB_VENV)/bin/python \
	ROBO_PIPE_METAWORLD_PYTHON=$(METAWORLD_VENV)/bin/python \
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile; tests=$$?; \
	wait $$types; typed=$$?; echo "mypy:"; cat $(VENV)/mypy.log; \
	test $$tests -eq 0 -a $$typed -eq 0

# Each test file on its own (the suite also runs in random order: pytest-randomly prints its
# seed; rerun an order with `pytest -p randomly --randomly-seed=N`). Slow: a Prefect server
# per file. Not part of `make test`.
test-each-file: setup lerobot-env
	@for f in $$(find tests -name 'test_*.py' | sort); do \
		echo "== $$f"; \
		ROBO_PIPE_LEROBOT_PYTHON=$(LEROBOT_VENV)/bin/python $(BIN)/pytest -q -p no:randomly "$$f" \
			|| exit 1; \
	done

# Mutation testing of the decision and math code (mutmut, [tool.mutmut] in pyproject.toml):
# every mutant of the functions below must make a test fail. Not part of CI (~15 min).
MUTATE ?= stages.statistics.* stages.evaluate.comparison.x_compare* stages.register.gates.* \
	deploy_edge.latency.x_verdict* deploy_edge.runtime.xǁControlLoopǁtick* \
	stages.finetune.ppo.x_gae* stages.finetune.ppo.x_clipped_objective* \
	stages.finetune.ppo.xǁPPOǁadvantages* stages.finetune.sac.x_soft_q_target* \
	stages.finetune.sac.x_actor_loss* stages.finetune.sac.x_temperature_loss* \
	stages.finetune.sac.xǁReplayBufferǁ* stages.finetune.rollout.x_chunk_transition* \
	stages.policy.base.xǁNormalizerǁ* stages.policy.base.xǁVLAPolicyǁset_normalizer* \
	stages.policy.base.xǁVLAPolicyǁforward* stages.policy.base.xǁVLAPolicyǁ*normalize_actions* \
	stages.policy.base.xǁOnnxPolicyǁforward* stages.dataset.writer.x_frame_timestamps* \
	stages.dataset.writer.x_video_spans*
mutation: setup
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,mutation]'
	rm -rf mutants
	$(BIN)/mutmut run $(MUTATE)
	$(BIN)/mutmut results --all true | grep -v ': killed' || true

bench: setup
	$(BIN)/python benchmarks/sim_throughput.py --quick
	$(BIN)/python benchmarks/finetune.py --quick

# Build outputs only: the home (./.robo-pipe: registry, datasets, checkpoints, signing keys) is
# the user's data and stays; delete it yourself if you mean to.
clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache mutants

# LeRobot (for the dataset compatibility test) needs Python 3.12 and torchvision, so it lives in
# its own environment, built once per machine outside the checkout and shared by every clone
# (~3 min and 5.4 GB the first time: its torch is the CUDA build).
LEROBOT_VERSION := 0.6.1
LEROBOT_VENV ?= $(HOME)/.cache/robo-pipe/lerobot-$(LEROBOT_VERSION)
# pyenv's python3.12 shim refuses to run unless 3.12 is selected, so prefer the interpreter itself.
LEROBOT_PY ?= $(or $(firstword $(wildcard $(shell pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12)),python3.12)

$(LEROBOT_VENV)/.installed:
	$(LEROBOT_PY) -m venv $(LEROBOT_VENV)
	$(LEROBOT_VENV)/bin/pip install --quiet 'lerobot[dataset]==$(LEROBOT_VERSION)'
	@touch $@

lerobot-env: $(LEROBOT_VENV)/.installed

lerobot-compat: setup lerobot-env
	ROBO_PIPE_LEROBOT_PYTHON=$(LEROBOT_VENV)/bin/python $(BIN)/pytest tests/stages/test_collect.py -k lerobot -v

# Isaac Lab 3 (the `isaaclab` simulator backend) needs Python 3.12 and pins its own torch, so it
# lives in its own environment, built once per machine outside the checkout like LeRobot's
# (~2.5 min and ~8 GB the first time). robo-pipe runs it as a worker process
# (sim_scenes/isaaclab/); its first start compiles Warp kernels (~2 min), cached in ~/.cache/warp.
ISAACLAB_VERSION := 3.0.0
ISAACLAB_VENV ?= $(HOME)/.cache/robo-pipe/isaaclab-$(ISAACLAB_VERSION)

$(ISAACLAB_VENV)/.installed:
	$(LEROBOT_PY) -m venv $(ISAACLAB_VENV)
	$(ISAACLAB_VENV)/bin/pip install --quiet --upgrade pip
	# mujoco-usd-converter 0.6.1: newer ones need a newer mujoco than Isaac Lab pins.
	$(ISAACLAB_VENV)/bin/pip install --quiet 'isaaclab==$(ISAACLAB_VERSION)' 'mujoco-usd-converter==0.6.1'
	@touch $@

isaaclab-env: $(ISAACLAB_VENV)/.installed

# Meta-World 3.1.1 (the MT10 benchmark tasks and their scripted experts) pins mujoco 3.3.0, which
# our own MuJoCo (4.x) cannot share a process with, so it lives in its own environment, built once
# per machine outside the checkout like Isaac Lab's (~1 min, ~0.3 GB). robo-pipe runs it as a
# worker process (sim_scenes/metaworld/); nothing in robo-pipe's own environment imports it.
METAWORLD_VERSION := 3.1.1
METAWORLD_VENV ?= $(HOME)/.cache/robo-pipe/metaworld-$(METAWORLD_VERSION)

$(METAWORLD_VENV)/.installed:
	$(LEROBOT_PY) -m venv $(METAWORLD_VENV)
	$(METAWORLD_VENV)/bin/pip install --quiet --upgrade pip
	# packaging: metaworld imports it without declaring it.
	$(METAWORLD_VENV)/bin/pip install --quiet 'metaworld==$(METAWORLD_VERSION)' 'packaging>=24' 'numpy>=2'
	@touch $@

metaworld-env: $(METAWORLD_VENV)/.installed
