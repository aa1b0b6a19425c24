# The two commands the README opens with. Each does all of its own set-up.
#
# `make up` installs roost alone (what `roost up` runs on); `make test` adds the test
# tools and the bench extra. Each install leaves its own stamp in the venv, so a venv
# shared by both ends up right whichever runs first, and a changed pyproject.toml
# re-runs both.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: up test install install-test browser lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev,bench]'
	touch $@

install: $(VENV)/.installed-run

install-test: $(VENV)/.installed-test

# The dashboard's browser suite drives Debian's chromium (Playwright, from the dev extra,
# with executable_path=/usr/bin/chromium; no browser download). Installed once, as root
# with apt-get; elsewhere the suite fails and says how to install it.
CHROMIUM ?= /usr/bin/chromium
browser:
	@if [ ! -x $(CHROMIUM) ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	  else \
	    echo "no $(CHROMIUM): run 'sudo apt-get install -y chromium' for the browser tests" >&2; \
	  fi; \
	fi

up: install
	$(BIN)/roost up

lint: install-test
	$(BIN)/ruff check src tests
	$(BIN)/mypy
	$(BIN)/lint-imports

test: lint browser
	$(BIN)/pytest -q

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
