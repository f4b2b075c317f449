#!/usr/bin/env bash
# Run Criterion test binaries one after another, grouped into parts (unit,
# simulator, cluster, chaos: by the binary's tests/ directory), and print:
#   - one line per binary (tests passed, seconds),
#   - every skipped test with its reason,
#   - each part's time,
#   - a closing line "N passed, M failed, K skipped" summed over all binaries.
# A binary that crashes, hangs (IDA_TEST_TIMEOUT) or exits nonzero without a
# Synthesis line counts as one failure. Exit status: 0 only when nothing failed.
set -uo pipefail

# The part a test binary belongs to, from its directory under tests/.
part_of() {
    case "$1" in
    */tests/sim/*) echo simulator ;;
    */tests/cluster/*) echo cluster ;;
    */tests/chaos/test_chaos) echo chaos ;;
    *) echo unit ;;
    esac
}
parts=(unit simulator cluster chaos)

passed=0
failed=0
skipped=0
bad=()
skips=()
declare -A part_secs
for part in "${parts[@]}"; do
    part_secs[$part]=0
    for t in "$@"; do
        [ "$(part_of "$t")" = "$part" ] || continue
        log=$(mktemp)
        start=$(date +%s.%N)
        # A hung binary is a failure, not a stalled run: kill it after
        # IDA_TEST_TIMEOUT seconds (default 600; the slowest takes about 60).
        # --verbose: Criterion names skipped tests only in verbose mode.
        timeout -k 10 "${IDA_TEST_TIMEOUT:-600}" "$t" --jobs "${CRITERION_JOBS:-2}" \
            --verbose >"$log" 2>&1
        rc=$?
        [ "$rc" -eq 124 ] && echo "TIMEOUT: $t ran longer than ${IDA_TEST_TIMEOUT:-600} s" >>"$log"
        secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}')
        part_secs[$part]=$(awk -v a="${part_secs[$part]}" -v b="$secs" 'BEGIN{printf "%.2f", a+b}')
        # Criterion may print a [SKIP] line without its newline: split first.
        mapfile -t sk < <(sed 's/\[====\]/\n[====]/g' "$log" | grep -a '^\[SKIP\]' |
            sed 's/^\[SKIP\] //')
        for s in "${sk[@]}"; do skips+=("$s"); done
        skipped=$((skipped + ${#sk[@]}))
        syn=$(grep -a 'Synthesis:' "$log" | tail -1)
        if [ -n "$syn" ]; then
            p=$(sed -E 's/.*Passing: ([0-9]+).*/\1/' <<<"$syn")
            f=$(sed -E 's/.*Failing: ([0-9]+).*/\1/' <<<"$syn")
            c=$(sed -E 's/.*Crashing: ([0-9]+).*/\1/' <<<"$syn")
            passed=$((passed + p))
            failed=$((failed + f)) # Criterion counts a crash among the failing too
        else
            p=0; f=1; c=0
            failed=$((failed + 1))
        fi
        if [ "$rc" -ne 0 ] || [ "$((f + c))" -ne 0 ]; then
            bad+=("$t")
            echo "FAIL $t (exit $rc)"
            grep -av '^\[RUN \]\|^\[PASS\]\|^\[----\] Criterion\|^\[====\] Running' "$log"
            [ "$rc" -ne 0 ] && [ "$((f + c))" -eq 0 ] && failed=$((failed + 1))
        else
            printf 'ok   %-50s %4d tests  %ss\n' "$t" "$p" "${secs:0:6}"
        fi
        rm -f "$log"
    done
done
echo
for s in "${skips[@]}"; do echo "skipped: $s"; done
line="time by part:"
for part in "${parts[@]}"; do line+=" $part ${part_secs[$part]}s"; done
echo "$line"
[ ${#bad[@]} -gt 0 ] && echo "failing: ${bad[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
