# The two commands the README opens with. Each does all of its own set-up.
#
# `make up` installs roost alone (what `roost up` runs on); `make test` adds the test
# tools and the bench extra. Each install leaves its own stamp in the venv, so a venv
# shared by both ends up right whichever runs first, and a changed pyproject.toml
# re-runs both.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: up test install install-test lint system-packages clean

# Debian packages the tests drive for real (COMMAND=PACKAGE): bubblewrap for the
# sandboxed instances; chromium for the dashboard's browser suite (Playwright, from the
# dev extra, with executable_path=/usr/bin/chromium; no browser download); the vm
# driver's tests boot micro-VMs: QEMU, qemu-img (a registered disk image's per-instance
# overlay), and for `roost images build` a static busybox, cpio and dpkg-deb (the
# kernel is fetched with apt-get download).
SYSTEM_PACKAGES := bwrap=bubblewrap chromium=chromium qemu-system-x86_64=qemu-system-x86 \
	qemu-img=qemu-utils busybox=busybox-static cpio=cpio

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

up: install
	$(BIN)/roost up

lint: install-test
	$(BIN)/ruff check src tests
	$(BIN)/mypy
	$(BIN)/lint-imports

system-packages:
	tools/system-packages.sh $(SYSTEM_PACKAGES)

test: lint system-packages
	$(BIN)/pytest -q

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
