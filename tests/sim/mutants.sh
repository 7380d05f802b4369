#!/usr/bin/env bash
# Puts back, one at a time, bugs that were fixed, and runs the simulator on each: every one
# must be found within the budget (MRG_SIM_SCHEDULES, default 10,000 schedules). Prints, per bug, after how many schedules it was found and what broke.
# The patches are in tests/sim/mutants/; each is taken back out whatever happens. Those in
# tests/sim/mutants/missed/ are bugs the simulator does not find yet (the README says why): not run.
set -euo pipefail
cd "$(dirname "$0")/../.."
budget=${MRG_SIM_SCHEDULES:-10000}
status=0
for patch in tests/sim/mutants/*.patch; do
    name=$(basename "$patch" .patch)
    if ! git apply "$patch"; then
        echo "$name: the patch no longer applies to the code; write it again against it"
        exit 1
    fi
    trap 'git apply -R "$patch"' EXIT
    out=$(MRG_SIM_NO_SHRINK=1 MRG_SIM_SCHEDULES=$budget cargo test --all-features --test sim -- --exact schedules_keep_the_promise 2>&1 || true)
    git apply -R "$patch"
    trap - EXIT
    if found=$(grep -oE "after [0-9]+ schedules, schedule [0-9]+" <<<"$out"); then
        echo "$name: found $found"
        grep -m1 -A1 "breaks the promise:" <<<"$out" | tail -n1 | sed 's/^/    /'
    else
        echo "$name: NOT FOUND in $budget schedules"
        # A run that passes prints nothing here: no match must not end the script before the
        # other bugs are run.
        grep -E "schedules in|error" <<<"$out" | head -n3 | sed 's/^/    /' || true
        status=1
    fi
done
exit $status
