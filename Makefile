# kvhit — every target sets up what it needs from nothing.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
export NUMBA_CACHE_DIR ?= $(CURDIR)/.numba_cache
export MPLBACKEND ?= Agg

.PHONY: venv demo test test-fast bench lint clean

venv: $(STAMP)

$(STAMP): requirements.lock requirements-dev.lock pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.lock -r requirements-dev.lock
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/kvhit demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -m "not slow"

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

clean:
	rm -rf $(VENV) .numba_cache .pytest_cache build src/*.egg-info
