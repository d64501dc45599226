# The two commands a new user runs: `make run` and `make test`. Both install into .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install run test lint chromium bench test-faults test-spreadsheet clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

run: install
	$(BIN)/space up

lint: install
	$(BIN)/ruff check src tests benchmarks migrations
	$(BIN)/ruff format --check src tests benchmarks migrations
	$(BIN)/mypy

test: lint chromium
	$(BIN)/pytest

# The browser tests drive the distribution's Chromium (Playwright's own browser download is not used), found where
# tests/browser/conftest.py looks: SPACE_TEST_CHROMIUM, else `chromium` on the PATH, else /usr/bin/chromium. When
# none is there it is installed from the distribution's packages (with sudo unless root). `make chromium
# CHROMIUM=/nowhere APT_GET="echo apt-get"` shows what a machine without it runs, without running it.
CHROMIUM ?= $(or $(SPACE_TEST_CHROMIUM),$(shell command -v chromium 2>/dev/null),/usr/bin/chromium)
APT_GET ?= apt-get

chromium:
	@[ -x "$(CHROMIUM)" ] || { \
	  if [ -n "$$SPACE_TEST_CHROMIUM" ]; then echo "SPACE_TEST_CHROMIUM=$$SPACE_TEST_CHROMIUM is not a program"; exit 1; fi; \
	  echo "no Chromium at $(CHROMIUM): installing the distribution's chromium with apt-get"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO $(APT_GET) update && $$SUDO env DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y chromium; }

test-faults: install
	$(BIN)/pytest -m faults

# A guarded CSV through headless LibreOffice (not part of `make test`: it needs LibreOffice, installed here
# from the distribution's packages when `soffice` is missing).
test-spreadsheet: install
	@command -v soffice >/dev/null 2>&1 || { \
	  echo "soffice not found: installing LibreOffice Calc (headless) with apt-get"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libreoffice-calc-nogui; }
	$(BIN)/pytest -n 0 tests/spreadsheet/check_roundtrip.py -v -rP

bench: install
	$(BIN)/python -m benchmarks.run
	$(BIN)/python -m benchmarks.incremental

clean:
	rm -rf $(VENV) .space .pytest_cache .mypy_cache .ruff_cache
