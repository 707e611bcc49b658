#!/usr/bin/env bash
# Build the documentation site into ./site with mkdocs --strict (any warning fails the build).
#   bash scripts/build_docs.sh
# Installs the `docs` extra (mkdocs, mkdocs-material, mkdocstrings[python]) into ./.venv first;
# run scripts/install.sh before it if .venv does not exist yet.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/install.sh
.venv/bin/python -m pip install -q -e '.[docs]'
.venv/bin/python -m mkdocs build --strict -d site
