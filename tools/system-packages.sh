#!/usr/bin/env bash
# Installs the Debian packages the test suite drives for real, when they are missing.
# Each argument is COMMAND=PACKAGE: the command the tests run and the package it comes
# from. As root with apt-get, missing ones are installed (with one `apt-get update`
# first); otherwise this says how, and the tests that need them fail with the same hint.
set -euo pipefail
missing=()
for pair in "$@"; do
    cmd="${pair%%=*}"
    pkg="${pair#*=}"
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing system packages for the tests: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 || {
        apt-get update -q >/dev/null
        apt-get install -y -q "${missing[@]}" >/dev/null
    }
else
    echo "warning: missing system packages (tests that need them will fail):" \
         "apt-get install ${missing[*]}" >&2
fi
