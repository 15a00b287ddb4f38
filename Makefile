# Two commands do all set-up on a fresh machine with Python 3.11+ and make:
#   make demo   -> creates .venv, installs cardbus, runs the demo pipeline
#   make test   -> creates .venv, installs cardbus[dev], runs lint, types and the whole suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

PACKAGES := agents bus eventstore projections tools

.PHONY: demo test check lint bench clean install typecheck-tree

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/cardbus demo

# mypy finds `cardbus` through links: .typecheck/cardbus/<pkg> -> ../../<pkg>,
# and cardbus.testing -> ../../tests/contract
# (the installed package maps the same folders with setuptools' package-dir)
typecheck-tree:
	@mkdir -p .typecheck/cardbus
	@ln -sfn ../../__init__.py .typecheck/cardbus/__init__.py
	@for p in $(PACKAGES); do ln -sfn ../../$$p .typecheck/cardbus/$$p; done
	@ln -sfn ../../tests/contract .typecheck/cardbus/testing

check: $(STAMP) typecheck-tree
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: check
	$(BIN)/python -m pytest -q -n 2 -p no:cacheprovider

# every bench appends its figures (JSON lines) to $(BENCH_JSON); bench/summary.py prints
# them as one table at the end
export CARDBUS_BENCH_JSON := bench/.figures.jsonl
BENCH_JSON := $(CARDBUS_BENCH_JSON)

bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[bench]'
	@rm -f $(BENCH_JSON)
	@uptime
	$(BIN)/python bench/eventstore_bench.py
	$(BIN)/python bench/pipeline_bench.py
	CARDBUS_UVLOOP=0 $(BIN)/python bench/pipeline_bench.py
	$(BIN)/python bench/replay_bench.py --events 100000
	$(BIN)/python bench/tracing_bench.py
	$(BIN)/python bench/idle_bench.py
	$(BIN)/python bench/nats_bench.py
	$(BIN)/python bench/nats_log_growth_bench.py
	$(BIN)/python bench/memory_bench.py
	$(BIN)/python bench/concurrency_bench.py
	$(BIN)/python bench/planning_bench.py
	$(BIN)/python bench/restart_bench.py --json $(BENCH_JSON)
	$(BIN)/python bench/agent_latency_bench.py --json $(BENCH_JSON)
	$(BIN)/python bench/journal_bench.py --json $(BENCH_JSON)
	$(BIN)/python bench/nats_scale_bench.py --json $(BENCH_JSON)
	$(BIN)/python bench/overload_bench.py
	@uptime
	$(BIN)/python bench/summary.py $(BENCH_JSON)

clean:
	rm -rf $(VENV) .typecheck cardbus.db cardbus.db-wal cardbus.db-shm cardbus.db.proj* cardbus.db.snap
