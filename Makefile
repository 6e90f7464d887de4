# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint bench clean venv system-deps

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/wordcount.py --words 200000
	$(BIN)/python examples/trade_monitor.py --duration 5

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/mypy

# servers the connector tests start (never skipped: installed here when missing)
system-deps:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
		(echo "installing PostgreSQL for the connector tests"; apt-get update -q && apt-get install -y -q postgresql)

test: lint system-deps
	$(BIN)/python -m pytest -q

test-fast: $(STAMP) system-deps
	$(BIN)/python -m pytest -q -m "not slow"

bench: $(STAMP)
	$(BIN)/python bench/wordcount.py
	$(BIN)/python bench/windowing.py

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
