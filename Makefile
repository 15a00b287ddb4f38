# Two commands do all set-up on a fresh machine with Python 3.11+ and make:
#   make demo   -> creates .venv, installs cardbus alone (no test tools), runs the demo pipeline
#   make test   -> creates .venv, installs cardbus[dev], runs lint, types, the docs build and the suite
#                  (python -P: the cwd is not put first on sys.path, where the repository's
#                  folders would shadow installed packages: openai-agents installs `agents`)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CKSUM := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# what `make demo` needs: cardbus and its dependencies, nothing else
DEMO_STAMP := $(VENV)/.installed-demo-$(CKSUM)
# what test, check, docs and bench need: the dev extra (which includes the demo's)
STAMP := $(VENV)/.installed-dev-$(CKSUM)

PACKAGES := agents bus eventstore projections tools

.PHONY: demo test check lint bench clean install typecheck-tree docs docs-serve chromium

$(DEMO_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e .
	@rm -f $(VENV)/.installed-demo-*
	@touch $(DEMO_STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@# the Node agent's client (tests/e2e/test_node_agent.py), where Node.js is installed
	@if command -v npm >/dev/null; then cd examples/node_agent && npm ci --no-audit --no-fund --loglevel=error; fi
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP) $(DEMO_STAMP)

install: $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/cardbus demo

# mypy finds `cardbus` through links: .typecheck/cardbus/<pkg> -> ../../<pkg>,
# and cardbus.testing -> ../../tests/contract
# (the installed package maps the same folders with setuptools' package-dir); it runs in
# .typecheck, since mypy puts its cwd before site-packages, where the repository's folders
# would shadow installed packages of the same names (openai-agents' `agents`)
typecheck-tree:
	@mkdir -p .typecheck/cardbus
	@ln -sfn ../../__init__.py .typecheck/cardbus/__init__.py
	@for p in $(PACKAGES); do ln -sfn ../../$$p .typecheck/cardbus/$$p; done
	@ln -sfn ../../tests/contract .typecheck/cardbus/testing
	@# the docs hooks, the docs tests and each example, linked in as folders of their own:
	@# given as ../<path>, mypy crawled up from them past the repository's root (it has an
	@# __init__.py) into the clone's parent folder, and read any stray .py file there
	@ln -sfn ../docs/_hooks .typecheck/_docs_hooks
	@ln -sfn ../tests/docs .typecheck/_tests_docs
	@mkdir -p .typecheck/_examples
	@# an example gone since the last link (another branch's) would fail mypy: unlinked first
	@find .typecheck/_examples -xtype l -delete
	@for d in examples/*/; do n=$$(basename $$d); ln -sfn ../../examples/$$n .typecheck/_examples/$$n; done

check: $(STAMP) typecheck-tree
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	cd .typecheck && ../$(BIN)/mypy --config-file ../pyproject.toml
	cd .typecheck && ../$(BIN)/mypy --config-file ../pyproject.toml _docs_hooks _tests_docs
	@for d in .typecheck/_examples/*; do \
		(cd .typecheck && ../$(BIN)/mypy --config-file ../pyproject.toml --no-error-summary _examples/$$(basename $$d)) || exit 1; \
	done

# tests/docs/ builds the site with --strict too, and runs every block of docs/ and examples/
# --dist worksteal: an idle worker takes tests queued for the other; with the default
# (load) one worker was measured finishing 275 s after the other, the slow tests queued on it
test: check chromium
	$(BIN)/python -P -m pytest -q -rs -n 2 --dist worksteal -p no:cacheprovider

# the console and replay-page tests drive a real headless Chromium (Debian's package: no
# browser is downloaded at run time); installed here where apt-get can (root), else the
# tests that need it say so (skipped with the reason; failed when CI is set)
chromium:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
		|| echo "note: Chromium is not installed (apt-get install chromium): the browser tests will say so"

# the site: docs/ (mkdocs.yml), the reference pages generated from the code at build time
# (docs/_hooks/); --strict: a broken link or a missing reference fails the build
docs: $(STAMP) typecheck-tree
	$(BIN)/mkdocs build --strict

docs-serve: $(STAMP) typecheck-tree
	$(BIN)/mkdocs serve

# every bench appends its figures (JSON lines) to $(BENCH_JSON); bench/summary.py prints
# them as one table at the end and saves them, with the machine and the time, to
# $(SPEED_FIGURES): commit it, the docs' speed page renders it (the docs build runs no bench)
export CARDBUS_BENCH_JSON := bench/.figures.jsonl
BENCH_JSON := $(CARDBUS_BENCH_JSON)
SPEED_FIGURES := docs/explanation/speed-figures.json

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
	$(BIN)/python -P bench/limits_bench.py
	$(BIN)/python -P bench/priority_bench.py
	@uptime
	$(BIN)/python bench/summary.py $(BENCH_JSON) --write $(SPEED_FIGURES)

clean:
	rm -rf $(VENV) .typecheck site cardbus.db cardbus.db-wal cardbus.db-shm cardbus.db.proj* cardbus.db.snap
