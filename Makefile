# Two commands do everything on a fresh clone: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run demo test lint bench bench-check clean kube-bin

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# `make run` needs the runtime dependencies only; the dev tools are installed by `make test`.
RUN_STAMP := $(VENV)/.installed-run
PORT ?= 8080

$(RUN_STAMP): pyproject.toml
	@echo "make run: installing gpupool and its dependencies into $(VENV) (first run only, a few minutes)"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -e .
	touch $(RUN_STAMP)

# The platform on its embedded defaults: SQLite under .gpupool/, the virtual cluster from
# examples/cluster, the API and dashboard on http://127.0.0.1:$(PORT) (it prints the admin token).
run: $(RUN_STAMP)
	$(BIN)/gpupool serve --port $(PORT)

demo: $(STAMP)
	$(BIN)/gpupool demo

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -n 2 tests

bench: $(STAMP)
	$(BIN)/gpupool bench engine
	$(BIN)/gpupool bench submit

# Not part of `make test` (a benchmark, about a minute): CPU-time ratios of the engine bench, a
# Philly prefix and the CLI's start against bench/baseline.json; fails when one grew past the
# baseline's tolerance (bench/check.py says how each is taken; --update takes a new baseline).
bench-check: $(STAMP)
	$(BIN)/python bench/check.py

clean:
	rm -rf $(VENV) .gpupool .pytest_cache .mypy_cache .ruff_cache

# The real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) built
# from the Go modules pinned in tools/kube/go.mod into .cache/kube/<version>/ (issue 24); a
# binary already there, or in $GPUPOOL_KUBE_BIN_CACHE (~/.cache/gpupool/kube), is not rebuilt.
kube-bin:
	tools/kube/build.sh
