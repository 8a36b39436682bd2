#!/usr/bin/env bash
# Run every test in the workspace: unit tests, property tests, and the end-to-end tests that
# start real proxies, control nodes and upstream servers on loopback, and the control API
# fuzzed by schemathesis. This is the README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."
# End-to-end tests start the real binaries (target/debug/weft-proxy); test runners build only
# test targets, so build the binaries first.
cargo build --workspace --bins
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@"
else
  echo "cargo-nextest not found; using cargo test (install: cargo install cargo-nextest)"
  cargo test --workspace --no-fail-fast "$@"
fi
# The control API fuzzed from its OpenAPI document (skipped, with a message, without schemathesis).
scripts/api-fuzz.sh
