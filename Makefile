# trainguard: `make test` runs every check; `make demo` runs the detect -> alert -> remediate loop.
# Both set up what they need on a fresh machine (a virtualenv in $(VENV)).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch; installed first and pinned so that no other requirement resolves a
# newer (CUDA, multi-GB) release. GPU users install their own torch before trainguard.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install lint typecheck unit test demo bench clean

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

typecheck: install
	$(BIN)/mypy

unit: install
	$(BIN)/pytest

test: lint typecheck unit

# Until the full detect -> alert -> remediate drill lands (issue 7), the demo is the
# instrumented two-rank DDP example: a straggler that compute time finds and step time hides.
demo: install
	$(BIN)/torchrun --nproc-per-node 2 examples/ddp_train.py $(DEMO_ARGS)

bench: install
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .pytest_cache .ruff_cache
