# trainguard: `make test` runs every check; `make demo` runs the detect -> alert -> remediate loop.
# Both set up what they need on a fresh machine (a virtualenv in $(VENV)).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch; installed first and pinned so that no other requirement resolves a
# newer (CUDA, multi-GB) release. GPU users install their own torch before trainguard.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install lint typecheck unit test demo drill bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $@

install: $(STAMP)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy

unit: install
	$(BIN)/pytest

test: lint typecheck unit

# The whole loop on this machine: remediation service, exporter, Prometheus, Alertmanager and a
# 2-node x 2-rank torchrun elastic job with a straggler, a hang and an OOM (about 3 minutes).
# DEMO_ARGS="--keep-running" leaves the stack up; see `trainguard demo --help` for ports.
demo: install
	$(BIN)/python -m trainguard demo $(DEMO_ARGS)

bench: install
	$(BIN)/python -m benchmarks.overhead

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .pytest_cache .ruff_cache
# The fault drill alone (it is also part of `make test`).
drill: install
	$(BIN)/pytest tests/e2e -m e2e -s
