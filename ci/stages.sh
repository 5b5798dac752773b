# Sourced by ci/test.sh (and any tier script): run each step as a named
# stage, time it, keep its output, and print a table at the end.
#
#   stage NAME CMD...   runs CMD, its output to the terminal and to
#                       $CI_LOG_DIR/NN.log; stops the run (table first)
#                       when CMD fails
#   stage_last_line     the last line the previous stage printed
#   stage_summary       the table: each stage's wall seconds and tests
#                       passed, the total, the ten slowest test binaries,
#                       and one `N passed, M failed` line
#
# Tests are counted from cargo's `test result:` lines and the plain
# `N passed, M failed` lines of our own suites (firmware, llama.cpp,
# Flower), so the table's count is the number of tests that ran.
CI_LOG_DIR=${CI_LOG_DIR:-${CARGO_TARGET_DIR:-$PWD/target}/ci-logs}
rm -rf "$CI_LOG_DIR"
mkdir -p "$CI_LOG_DIR"
_stage_names=()
_stage_secs=()
_stage_start=$SECONDS

_stage_log() { printf '%s/%02d.log' "$CI_LOG_DIR" "$1"; }

stage() {
    local name=$1 i=${#_stage_names[@]} t0=$SECONDS rc
    shift
    echo "== $name"
    set +e
    "$@" 2>&1 | tee "$(_stage_log "$i")"
    rc=${PIPESTATUS[0]}
    set -e
    _stage_names+=("$name")
    _stage_secs+=($((SECONDS - t0)))
    if ((rc)); then
        echo "stage '$name' failed (exit $rc)"
        stage_summary || true
        exit "$rc"
    fi
}

stage_last_line() { tail -n 1 "$(_stage_log $((${#_stage_names[@]} - 1)))"; }

# passed LOG / failed LOG: tests passed (failed) in one stage's log.
_count() {
    local what=$1 log=$2
    { sed -nE "s/^test result: [A-Za-z]+\. ([0-9]+) passed; ([0-9]+) failed.*/\\$what/p" "$log"
      sed -nE "s/^([A-Za-z-]+: )?([0-9]+) passed, ([0-9]+) failed.*/\\$((what + 1))/p" "$log"
    } | awk '{s += $1} END {print s + 0}'
}

stage_summary() {
    local i total_pass=0 total_fail=0 p f
    echo
    echo "== stages ($(lscpu | sed -n 's/^Model name: *//p' | head -n 1), $(nproc) cores, $(date -u +%F))"
    printf '%6s  %6s  %s\n' "wall s" "tests" "stage"
    for i in "${!_stage_names[@]}"; do
        p=$(_count 1 "$(_stage_log "$i")")
        f=$(_count 2 "$(_stage_log "$i")")
        total_pass=$((total_pass + p))
        total_fail=$((total_fail + f))
        printf '%6d  %6d  %s\n' "${_stage_secs[$i]}" "$p" "${_stage_names[$i]}"
    done
    printf '%6d  %6d  %s\n' $((SECONDS - _stage_start)) "$total_pass" "total"
    echo
    echo "== ten slowest test binaries (seconds, stage)"
    for i in "${!_stage_names[@]}"; do
        awk -v stage="${_stage_names[$i]}" '
            /^ *Running / { bin = $0; sub(/^ *Running /, "", bin)
                            sub(/\(.*\/deps\//, "(", bin); sub(/-[0-9a-f]+\)$/, ")", bin) }
            /^ *Doc-tests / { bin = $0; sub(/^ */, "", bin) }
            /^test result:/ && bin != "" {
                t = $NF; sub(/s$/, "", t); printf "%8.1f  %s  (%s)\n", t, bin, stage; bin = "" }' \
            "$(_stage_log "$i")"
    done | sort -rn | head -n 10
    echo
    echo "ci: $total_pass passed, $total_fail failed"
}
