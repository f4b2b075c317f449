#!/usr/bin/env bash
# Run Criterion test binaries one after another; print each binary's result
# and a closing line "N passed, M failed" summed over all of them.
# A binary that crashes, hangs (IDA_TEST_TIMEOUT) or exits nonzero without a
# Synthesis line counts as one failure. Exit status: 0 only when nothing failed.
set -uo pipefail
passed=0
failed=0
bad=()
for t in "$@"; do
    log=$(mktemp)
    start=$(date +%s.%N)
    # A hung binary is a failure, not a stalled run: kill it after
    # IDA_TEST_TIMEOUT seconds (default 600; the slowest takes about 60).
    timeout -k 10 "${IDA_TEST_TIMEOUT:-600}" "$t" --jobs "${CRITERION_JOBS:-2}" >"$log" 2>&1
    rc=$?
    [ "$rc" -eq 124 ] && echo "TIMEOUT: $t ran longer than ${IDA_TEST_TIMEOUT:-600} s" >>"$log"
    secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}')
    syn=$(grep -a 'Synthesis:' "$log" | tail -1)
    if [ -n "$syn" ]; then
        p=$(sed -E 's/.*Passing: ([0-9]+).*/\1/' <<<"$syn")
        f=$(sed -E 's/.*Failing: ([0-9]+).*/\1/' <<<"$syn")
        c=$(sed -E 's/.*Crashing: ([0-9]+).*/\1/' <<<"$syn")
        passed=$((passed + p))
        failed=$((failed + f + c))
    else
        p=0; f=1; c=0
        failed=$((failed + 1))
    fi
    if [ "$rc" -ne 0 ] || [ "$((f + c))" -ne 0 ]; then
        bad+=("$t")
        echo "FAIL $t (exit $rc)"
        cat "$log"
        [ "$rc" -ne 0 ] && [ "$((f + c))" -eq 0 ] && failed=$((failed + 1))
    else
        printf 'ok   %-50s %4d tests  %ss\n' "$t" "$p" "${secs:0:6}"
    fi
    rm -f "$log"
done
echo
[ ${#bad[@]} -gt 0 ] && echo "failing: ${bad[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
