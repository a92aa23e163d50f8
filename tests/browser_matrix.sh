#!/usr/bin/env bash
# Run the browser approval tests (tests/test_browser.py) once per ipykernel version, each in
# its own throwaway venv, and print one line per version: passed/FAILED, install and test time.
# Not part of CI (it installs from PyPI twice). Needs python3 -m venv and /usr/bin/chromium.
#
#   tests/browser_matrix.sh                       # ipykernel newest 6.x and 7.3.x
#   tests/browser_matrix.sh 'ipykernel==7.4.*'    # any pip requirement(s), one venv each
#
# Why these versions: 6.x has no subshells (a click waits behind a busy cell), 7.0-7.3 run
# widget callbacks on a subshell thread; the approval design must work on both.
# CI=true makes a missing chromium fail instead of skip, so "passed" means the tests ran.
# Keep the venvs for inspection with KEEP_VENVS=1. Exit status: 0 when every version passed.
set -uo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
if [ "$#" -gt 0 ]; then
    pins=("$@")
else
    pins=('ipykernel==6.*' 'ipykernel==7.3.*')
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/durable-nb-matrix.XXXXXX")"
if [ "${KEEP_VENVS:-0}" = 1 ]; then
    echo "venvs kept in $work"
else
    trap 'rm -rf "$work"' EXIT
fi

summary=()
failed=0
for i in "${!pins[@]}"; do
    pin="${pins[$i]}"
    venv="$work/venv-$i"
    log="$work/venv-$i.log"
    echo "== $pin: venv $venv"
    t0=$SECONDS
    if ! { python3 -m venv "$venv" &&
           "$venv/bin/python" -m pip install -q --disable-pip-version-check \
               -e "$repo[test]" "$pin"; } >"$log" 2>&1; then
        cat "$log"
        summary+=("$pin: FAILED to install ($((SECONDS - t0)) s)")
        failed=1
        continue
    fi
    installed=$((SECONDS - t0))
    versions="$("$venv/bin/python" -c 'import importlib.metadata as m
print(" ".join(f"{p} {m.version(p)}" for p in ("ipykernel", "jupyterlab", "ipywidgets", "playwright")))')"
    echo "   installed in ${installed} s: $versions"
    t1=$SECONDS
    # From the repo root: the tests import the harness as the package `tests.harness`.
    (cd "$repo" && CI=true "$venv/bin/python" -m pytest -q -p no:cacheprovider \
        tests/test_browser.py)
    status=$?
    tested=$((SECONDS - t1))
    if [ "$status" -eq 0 ]; then
        summary+=("$pin ($versions): passed, tests ${tested} s, install ${installed} s")
    else
        summary+=("$pin ($versions): FAILED (pytest exit $status), tests ${tested} s")
        failed=1
    fi
done

echo "== summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
