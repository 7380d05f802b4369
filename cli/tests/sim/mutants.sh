#!/usr/bin/env bash
# Puts back, one at a time, bugs that were fixed, and runs the simulator on each: every one
# must be found within the budget (MRG_SIM_SCHEDULES, default 10,000 schedules). Prints, per bug, after how many schedules it was found and what broke.
# The patches are in cli/tests/sim/mutants/; each is taken back out whatever happens. Those in
# cli/tests/sim/mutants/missed/ are bugs the simulator does not find yet (docs/simulation.md says why): not run.
# Those in cli/tests/sim/mutants/pg/ break the PostgreSQL ledger, which the simulator does not
# drive: each runs against the PostgreSQL schedules (tests/pg_schedules.rs) within their budget
# (MRG_PG_SCHEDULES, default 50), on the server of MCP_REPLAY_GUARD_POSTGRES_URL.
# `mutants.sh sim` runs only the simulator's, `mutants.sh pg` only the PostgreSQL ones.
set -euo pipefail
cd "$(dirname "$0")/../../.."
only=${1:-}
budget=${MRG_SIM_SCHEDULES:-10000}
pg_budget=${MRG_PG_SCHEDULES:-50}
status=0

# Applies $1, runs the rest of the arguments, takes the patch back out; the run's output in $out.
run_mutant() {
    local patch=$1
    shift
    if ! git apply "$patch"; then
        echo "$(basename "$patch" .patch): the patch no longer applies to the code; write it again against it"
        exit 1
    fi
    trap 'git apply -R "$patch"' EXIT
    out=$("$@" 2>&1 || true)
    git apply -R "$patch"
    trap - EXIT
}

# Prints after how many schedules the mutant was found and what broke, or that it was not.
found_or_not() {
    local name=$1 budget=$2
    if found=$(grep -oE "after [0-9]+ schedules, schedule [0-9]+" <<<"$out"); then
        echo "$name: found $found"
        grep -m1 -A1 "breaks the promise:" <<<"$out" | tail -n1 | sed 's/^/    /'
    else
        echo "$name: NOT FOUND in $budget schedules"
        # (A test that passes prints no figures of its own: its result line says how it ended.)
        grep -E "schedules in|test result|error|skipped" <<<"$out" | head -n3 | sed 's/^/    /' || true
        status=1
    fi
}

if [[ "$only" != pg ]]; then
    for patch in cli/tests/sim/mutants/*.patch; do
        run_mutant "$patch" env MRG_SIM_NO_SHRINK=1 MRG_SIM_SCHEDULES="$budget" \
            cargo test -p replay-guard --all-features --test sim -- --exact schedules_keep_the_promise
        found_or_not "$(basename "$patch" .patch)" "$budget"
    done
fi

if [[ "$only" != sim ]]; then
    if [[ -z "${MCP_REPLAY_GUARD_POSTGRES_URL:-}" ]]; then
        echo "cli/tests/sim/mutants/pg: skipped, MCP_REPLAY_GUARD_POSTGRES_URL is not set"
        [[ -z "${CI:-}" ]] || status=1
    else
        for patch in cli/tests/sim/mutants/pg/*.patch; do
            run_mutant "$patch" env MRG_PG_SCHEDULES="$pg_budget" \
                cargo test --all-features --test pg_schedules -- --exact pg_schedules_keep_the_promise
            found_or_not "$(basename "$patch" .patch)" "$pg_budget"
        done
    fi
fi
exit $status
