#!/usr/bin/env bash
# Makes (once) the virtual environment the Python package is built and tested in, with maturin,
# pytest, NumPy and mypy, and prints its bin/ directory. It lives in target/python-env (git-ignored,
# beside cargo's artifacts). Needs CPython >= 3.11 as python3 (the package is an abi3 wheel for it).
set -euo pipefail
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
env_dir="$repo/target/python-env"

if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "python-env: the Python package needs CPython >= 3.11 as python3; found $(python3 --version 2>&1)" >&2
    exit 1
fi
if [[ ! -x "$env_dir/bin/python" ]]; then
    python3 -m venv "$env_dir" >&2
fi
"$env_dir/bin/python" -m pip install -q --disable-pip-version-check maturin pytest numpy mypy >&2
echo "$env_dir/bin"
