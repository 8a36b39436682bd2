#!/usr/bin/env bash
# Fuzz the control API from its own OpenAPI document with schemathesis: a single-node control
# plane with bearer tokens, every operation, generated and mutated inputs. Fails on any 5xx
# response, on a crash, or on a panic in the node's log. Then scripts/api-mutate.py: every
# number of a valid spec per kind replaced by extremes, on a node of its own. Needs `schemathesis` (pip) and the
# debug build of weft-control (scripts/test.sh builds it first).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v schemathesis >/dev/null 2>&1; then
  echo "api-fuzz: SKIPPED — schemathesis not installed (pip install schemathesis); .ci/run installs it"
  exit 0
fi
work=$(mktemp -d)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
api=127.0.0.1:$(port); xds=127.0.0.1:$(port)
cat >"$work/tokens.yaml" <<TOKENS
tokens:
  - {name: ci-admin, token: ci-admin-token-0123, role: admin}
  - {name: ci-viewer, token: ci-viewer-token-0123, role: viewer}
TOKENS
target/debug/weft-control --id 1 --listen "$api" --xds-listen "$xds" --data-dir "$work/data" --init \
  --tokens "$work/tokens.yaml" --log warn 2>"$work/node.log" &
node=$!
trap 'kill $node 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  curl -sf -H 'Authorization: Bearer ci-viewer-token-0123' "http://$api/v1/status" | grep -q '"leader":1' && break
  sleep 0.1
done
status=0
schemathesis run "http://$api/openapi.json" -H 'Authorization: Bearer ci-admin-token-0123' \
  --checks not_a_server_error --max-examples "${API_FUZZ_EXAMPLES:-30}" --no-color || status=$?
if ! kill -0 $node 2>/dev/null; then
  echo "api-fuzz: FAILED — weft-control exited during the run"; tail -50 "$work/node.log"; exit 1
fi
if grep -q panicked "$work/node.log"; then
  echo "api-fuzz: FAILED — weft-control panicked"; grep -A5 panicked "$work/node.log"; exit 1
fi
# Without a token every operation is refused with 401, never served.
code=$(curl -s -o /dev/null -w '%{http_code}' -X PUT "http://$api/v1/clusters/x" -d '{}')
[ "$code" = 401 ] || { echo "api-fuzz: FAILED — unauthenticated PUT answered $code, not 401"; exit 1; }
code=$(curl -s -o /dev/null -w '%{http_code}' -X PUT -H 'Authorization: Bearer ci-viewer-token-0123' "http://$api/v1/clusters/x" -d '{}')
[ "$code" = 403 ] || { echo "api-fuzz: FAILED — viewer PUT answered $code, not 403"; exit 1; }
[ $status = 0 ] && echo "api-fuzz: OK — no 5xx, no crash, no panic" || echo "api-fuzz: FAILED (schemathesis exit $status)"
# Extremes in every number of every kind's spec, which schemathesis's generic `spec` never reaches.
python3 scripts/api-mutate.py target/debug/weft-control || status=1
exit $status
