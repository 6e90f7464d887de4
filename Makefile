# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# two stamps: the demo needs only the base install (no pyspark: 491 MB of a 628 MB venv);
# tests need the dev and spark extras too
BASE_STAMP := $(VENV)/.installed-base
STAMP := $(VENV)/.installed
CHROMIUM := /usr/bin/chromium
APT_GET ?= apt-get

.PHONY: demo test test-fast lint bench clean venv system-deps

$(BASE_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "Installing slipstream and what the demo needs (cloudpickle, rich, prometheus-client) into $(VENV) ..."
	$(BIN)/python -m pip install --progress-bar on --upgrade pip
	$(BIN)/python -m pip install --progress-bar on -e .
	touch $(BASE_STAMP)

$(STAMP): $(BASE_STAMP)
	@echo "Installing the test tools and pyspark (the [dev,spark] extras) ..."
	$(BIN)/python -m pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(BASE_STAMP)
	$(BIN)/python examples/wordcount.py --words 200000
	$(BIN)/python examples/trade_monitor.py --duration 5
	@echo
	@echo "Watch a job live: run"
	@echo "    $(BIN)/slipstream run examples/trade_monitor.py:watch_dag --dashboard 8080"
	@echo "and open http://127.0.0.1:8080/ in a browser (Ctrl-C stops the job)."

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/mypy

# servers the connector tests start, and the headless Chromium (Debian's package) the
# dashboard's browser test drives (never skipped: installed here when missing). apt-get
# needs root: the target says what it installs and why before it runs apt-get, and the
# README says so too.
system-deps:
	@missing=""; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	{ test -x $(CHROMIUM) && test -x /usr/bin/chromedriver; } || missing="$$missing chromium chromium-driver"; \
	if [ -n "$$missing" ]; then \
		echo "make test: installing Debian packages with apt-get (as root):$$missing"; \
		case "$$missing" in *postgresql*) echo "  postgresql: the connector tests start a private PostgreSQL cluster on 127.0.0.1";; esac; \
		case "$$missing" in *chromium*) echo "  chromium, chromium-driver: the dashboard's browser test drives headless Chromium";; esac; \
		$(APT_GET) update -q && $(APT_GET) install -y -q $$missing; \
	fi

test: lint system-deps
	$(BIN)/python -m pytest -q

test-fast: $(STAMP) system-deps
	$(BIN)/python -m pytest -q -m "not slow"

bench: $(STAMP)
	$(BIN)/python bench/wordcount.py
	$(BIN)/python bench/windowing.py

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
