# The two commands a new user runs: `make run` and `make test`. Both install into .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install run test lint bench test-faults clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

run: install
	$(BIN)/space up

lint: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

test-faults: install
	$(BIN)/pytest -m faults

bench: install
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) .space .pytest_cache .mypy_cache .ruff_cache
