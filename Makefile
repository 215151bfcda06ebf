# Two entry points: `make run` (default scenario) and `make test` (lint + test suite).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TSTAMP := $(VENV)/.installed-test

.PHONY: run test lint bench browser clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# the tests also need the PyTorch extra (a real DDP run against the service) and a browser
# (the dashboard is rendered in headless Chromium)
$(TSTAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,torch]'
	touch $(TSTAMP)

browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

run: $(STAMP)
	$(BIN)/fabricpilot run $(SCENARIO)

test: $(TSTAMP) browser
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/pytest -n auto --maxprocesses 8 --dist worksteal

bench: $(STAMP)
	$(BIN)/python benchmarks/run_benchmarks.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
