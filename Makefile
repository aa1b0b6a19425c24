# The two commands the README opens with. Each does all of its own set-up.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: up test install lint clean

$(BIN)/roost: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(BIN)/roost

install: $(BIN)/roost

up: install
	$(BIN)/roost up

lint: install
	$(BIN)/ruff check src tests
	$(BIN)/mypy
	$(BIN)/lint-imports

test: install lint
	$(BIN)/pytest -q

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
