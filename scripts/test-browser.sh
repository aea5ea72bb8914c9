#!/usr/bin/env bash
# Make the browser tests' browser present: Debian's chromium (Playwright drives it through
# executable_path; Playwright's own browser download is never used). The Playwright Python package
# comes with the dev extras (.venv). Fails when chromium is missing and cannot be installed, so
# `make test` never passes with the console untested.
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing chromium for the browser tests"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
  else
    echo "ERROR: chromium is missing and cannot be installed here (need root + apt-get); install it and rerun." >&2
    exit 1
  fi
fi
.venv/bin/python -c "import playwright" 2>/dev/null || { echo "ERROR: playwright missing from .venv (pip install -e '.[dev]')" >&2; exit 1; }
chromium --version
