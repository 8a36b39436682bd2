#!/usr/bin/env bash
# The compose test: brings up docker-compose.yml (3 control nodes, two variants behind inbound
# sidecars, a client sidecar with a load generator, Prometheus), checks routing through the mesh
# and that Prometheus holds weft metrics, kills the Raft leader's container, checks that traffic
# still flows and that a write still commits (and reaches the sidecars), then tears everything
# down (always, also on failure or Ctrl-C). Skipped, with exit 0, when no Docker engine answers.
#
#   scripts/compose-test.sh             # builds the images first (deploy/build-images.sh)
#   WEFT_SKIP_IMAGES=1 scripts/compose-test.sh   # use the images already built
#
# Every wait is bounded (WEFT_COMPOSE_WAIT seconds, default 60) and fails naming what it
# waited for. Published ports are 127.0.0.1-only and picked by Docker (no fixed host ports).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PROJECT=weft-compose-test
WAIT=${WEFT_COMPOSE_WAIT:-60}
START=$(date +%s%N)

elapsed() { local now; now=$(date +%s%N); printf '%d.%01d' $(((now - START) / 1000000000)) $(((now - START) / 100000000 % 10)); }
log() { echo "[compose-test +$(elapsed)s] $*"; }
fail() { echo "[compose-test +$(elapsed)s] FAIL: $*" >&2; exit 1; }

if ! command -v docker >/dev/null 2>&1; then
  echo "SKIP compose test: no Docker engine (docker is not installed)"
  exit 0
fi
if ! docker_err=$(docker info 2>&1 >/dev/null); then
  echo "SKIP compose test: no Docker engine (docker info failed: $(echo "$docker_err" | tail -1))"
  exit 0
fi
if command -v docker-compose >/dev/null 2>&1; then
  COMPOSE=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose)
else
  fail "a Docker engine answers but neither docker-compose nor the docker compose plugin is installed"
fi
dc() { "${COMPOSE[@]}" -p "$PROJECT" -f "$ROOT/docker-compose.yml" "$@"; }

# No fixed host ports: Docker picks free ones (on 127.0.0.1), read back with `port`.
export WEFT_CONTROL1_PORT=0 WEFT_CONTROL2_PORT=0 WEFT_CONTROL3_PORT=0 WEFT_CLIENT_PORT=0 WEFT_PROMETHEUS_PORT=0

ok=0
teardown() {
  local rc=$?
  if [ "$ok" != 1 ]; then
    echo "---- docker-compose ps and the end of each service's log (the test failed) ----" >&2
    dc ps >&2 || true
    dc logs --no-color --tail=15 >&2 || true
  fi
  log "docker-compose down -v"
  dc down -v --remove-orphans -t 2 >/dev/null 2>&1 || echo "compose-test: docker-compose down failed; remove the leftovers with: docker-compose -p $PROJECT down -v" >&2
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Polls "$@" every 0.5 s until it succeeds, for at most $WAIT seconds.
wait_for() {
  local what=$1; shift
  local deadline=$(( $(date +%s) + WAIT ))
  until "$@"; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "timed out after ${WAIT}s waiting until $what"
    sleep 0.5
  done
}

# ---- images -------------------------------------------------------------------------------
if [ "${WEFT_SKIP_IMAGES:-0}" != 1 ]; then
  log "building images (deploy/build-images.sh)"
  deploy/build-images.sh
  log "images built"
fi

# ---- up -----------------------------------------------------------------------------------
dc down -v --remove-orphans -t 1 >/dev/null 2>&1 || true # leftovers of an interrupted run
log "docker-compose -p $PROJECT up -d"
dc up -d 2>&1 | grep -v -e '^Creating' -e '^$' || true
port() { dc port "$1" "$2" | tail -1 | sed 's/.*://'; }
for n in 1 2 3; do
  p=$(port "control-$n" 7700)
  [ -n "$p" ] || fail "control-$n has no published API port"
  printf -v "API$n" '%s' "$p"
done
CLIENT=$(port client 15001)
PROM=$(port prometheus 9090)
log "published on 127.0.0.1: control APIs $API1 $API2 $API3, client sidecar $CLIENT, prometheus $PROM"

api() { curl -sf --max-time 3 "http://127.0.0.1:$1$2"; }
leader_of() { api "$1" /v1/members | grep -o '"leader":[0-9]*' | cut -d: -f2; }

three_voters() {
  local m
  m=$(api "$API1" /v1/members) || return 1
  [ "$(grep -o '"voter":true' <<<"$m" | wc -l)" = 3 ] && grep -q '"leader":[0-9]' <<<"$m"
}
wait_for "the control plane has 3 voters and a leader (GET /v1/members)" three_voters
LEADER=$(leader_of "$API1")
log "control plane: 3 voters, leader control-$LEADER"

setup_done() {
  local id state
  id=$(dc ps -q setup)
  state=$(docker inspect -f '{{.State.Status}} {{.State.ExitCode}}' "$id")
  [ "$state" = "exited 0" ] && return 0
  case $state in exited*) fail "the setup service (weftctl apply) failed: $state; $(docker logs --tail 5 "$id" 2>&1)" ;; esac
  return 1
}
wait_for "the setup service applied deploy/config/mesh.yaml" setup_done
log "setup: mesh applied with weftctl"

# ---- routing through the mesh --------------------------------------------------------------
BODY='{"inputs":[{"name":"input","datatype":"FP32","shape":[4],"data":[0.1,0.2,0.3,0.4]}]}'
# One request through the client's outbound sidecar; prints the variant that served it, or
# "error:<x-weft-error>" / "none" (the model's own 500s still carry the variant: it was routed).
infer() {
  local h
  h=$(curl -s -o /dev/null -D - --max-time 10 -H 'Host: ranker' -H 'content-type: application/json' "$@" \
    --data "$BODY" "http://127.0.0.1:$CLIENT/v2/models/ranker/infer" | tr -d '\r') || { echo none; return; }
  if grep -qi '^x-weft-error:' <<<"$h"; then
    echo "error:$(grep -i '^x-weft-error:' <<<"$h" | head -1 | cut -d' ' -f2)"
  elif grep -qi '^x-weft-variant:' <<<"$h"; then
    grep -i '^x-weft-variant:' <<<"$h" | head -1 | cut -d' ' -f2
  else
    echo none
  fi
}
routes_to() { [ "$(infer -H "x-weft-variant: $1")" = "$1" ]; }
wait_for "the client sidecar routes to variant a (x-weft-variant: a)" routes_to a
wait_for "the client sidecar routes to variant b (x-weft-variant: b)" routes_to b

# N requests with distinct user ids (sticky assignment): counts per variant in $SPLIT.
spread() {
  local n=$1 tag=$2 i v a=0 b=0 other=0
  for ((i = 0; i < n; i++)); do
    v=$(infer -H "x-user-id: $tag-$i")
    case $v in a) a=$((a + 1)) ;; b) b=$((b + 1)) ;; *) other=$((other + 1)) ;; esac
  done
  SPLIT="a=$a b=$b unrouted=$other"
  A=$a B=$b OTHER=$other
}
spread 40 before
[ "$OTHER" = 0 ] && [ "$A" -gt 0 ] && [ "$B" -gt 0 ] || fail "40 requests by distinct users did not all reach both variants: $SPLIT"
log "routing: 40 users through the client sidecar -> $SPLIT"

# ---- Prometheus --------------------------------------------------------------------------
promq() { curl -sf --max-time 3 -G "http://127.0.0.1:$PROM/api/v1/query" --data-urlencode "query=$1"; }
prom_has_all() {
  local r
  r=$(promq 'sum by (node) (weft_requests_total)') || return 1
  grep -q '"node":"client"' <<<"$r" && grep -q '"node":"ranker-a"' <<<"$r" && grep -q '"node":"ranker-b"' <<<"$r"
}
wait_for "Prometheus holds weft_requests_total from the client, ranker-a and ranker-b sidecars" prom_has_all
r=$(promq 'sum by (node) (weft_requests_total)')
log "prometheus: sum by (node) (weft_requests_total) = $(grep -o '"node":"[^"]*"},"value":\[[^]]*\]' <<<"$r" | sed -e 's/"node":"//' -e 's/"},"value":\[[0-9.]*,"/=/' -e 's/"\]//' | tr '\n' ' ')"
# Sidecar to sidecar is mutual TLS: the rankers served the client over mTLS, as the client's
# SPIFFE ID, and never in plaintext.
mtls_seen() {
  local r
  r=$(promq 'sum by (node) (weft_requests_total{tls="mtls",peer_identity="spiffe://weft.local/ns/ranking/sa/client"})') || return 1
  grep -q '"node":"ranker-a"' <<<"$r" && grep -q '"node":"ranker-b"' <<<"$r"
}
wait_for "Prometheus shows both rankers serving the client over mTLS" mtls_seen
plain=$(promq 'sum(weft_requests_total{node=~"ranker-.*",tls="plaintext"}) or vector(0)' | grep -o '"value":\[[^]]*\]' | sed 's/.*,"\(.*\)"\]/\1/')
[ "$plain" = 0 ] || fail "the rankers served $plain requests in plaintext (strict mTLS expected)"
log "mtls: both rankers serve the client as spiffe://weft.local/ns/ranking/sa/client, 0 plaintext requests"
up=$(promq 'sum(up{job="weft-sidecars"})' | grep -o '"value":\[[^]]*\]' | sed 's/.*,"\(.*\)"\]/\1/')
[ "$up" = 3 ] || fail "Prometheus scrapes $up of 3 sidecars (up{job=\"weft-sidecars\"})"
loadgen_seen() {
  promq 'sum(weft_requests_total{node="client"})' | grep -q '"value":\[[0-9.]*,"[1-9]'
}
log "prometheus: 3/3 sidecars up"

# ---- kill the leader ---------------------------------------------------------------------
declare -A APIS=([1]=$API1 [2]=$API2 [3]=$API3)
SURVIVORS=()
for n in 1 2 3; do [ "$n" = "$LEADER" ] || SURVIVORS+=("$n"); done
LEADER=$(leader_of "${APIS[${SURVIVORS[0]}]}") # may have moved since
SURVIVORS=()
for n in 1 2 3; do [ "$n" = "$LEADER" ] || SURVIVORS+=("$n"); done
S1=${APIS[${SURVIVORS[0]}]} S2=${APIS[${SURVIVORS[1]}]}
log "docker kill control-$LEADER (the leader)"
docker kill "$(dc ps -q "control-$LEADER")" >/dev/null
KILLED_AT=$(date +%s%N)

spread 30 during
log "traffic right after the kill: 30 users -> $SPLIT"
[ "$OTHER" = 0 ] || fail "requests failed right after the leader was killed: $SPLIT"

new_leader() {
  local l
  l=$(leader_of "$S1") || return 1
  [ -n "$l" ] && [ "$l" != "$LEADER" ]
}
wait_for "a surviving control node is elected leader" new_leader
NEW=$(leader_of "$S1")
log "control-$NEW leads after $(( ($(date +%s%N) - KILLED_AT) / 1000000 )) ms"

# A write through the surviving nodes: all traffic to variant a.
WEFTCTL=target/release/weftctl
set_weights() { "$WEFTCTL" --server "http://127.0.0.1:$S1,http://127.0.0.1:$S2" experiment set-weights ranker-ab a=100 b=0 >/tmp/weft-compose-test.out 2>&1; }
wait_for "weftctl experiment set-weights commits on the surviving nodes" set_weights
log "write committed: $(tr '\n' ' ' </tmp/weft-compose-test.out)"
rm -f /tmp/weft-compose-test.out
weight_read() { api "$S2" /v1/experiments/ranker-ab | grep -q '"name":"a"[^}]*"weight":100\|"weight":100[^}]*"name":"a"'; }
wait_for "the other surviving node reads the new weights (linearizable GET)" weight_read
all_to_a() {
  spread 20 after
  [ "$A" = 20 ]
}
wait_for "the new weights reach the client sidecar over xDS (20 users all on variant a)" all_to_a
log "after the write: 20 users -> $SPLIT (weights a=100 b=0 pushed by the surviving nodes)"

wait_for "the load generator's requests reach Prometheus" loadgen_seen
r=$(promq 'sum(weft_requests_total{node="client"})' | grep -o '"value":\[[^]]*\]' | sed 's/.*,"\(.*\)"\]/\1/')
log "prometheus: $r requests through the client sidecar so far (load generator + checks)"

p95=$(promq 'histogram_quantile(0.95, sum by (le, variant) (rate(weft_request_duration_seconds_bucket{node="client"}[1m])))' |
  grep -o '"variant":"[^"]*"},"value":\[[^]]*\]' | sed -e 's/"variant":"//' -e 's/"},"value":\[[0-9.]*,"/=/' -e 's/"\]//' | tr '\n' ' ')
log "prometheus: p95 latency (s) by variant at the client sidecar, last minute: $p95"

# The recording rules of deploy/config/weft-rules.yml (what the Grafana dashboard reads).
recorded() { promq 'weft:variant_requests:rate1m{experiment="ranker-ab"}' | grep -q '"variant":"a"'; }
wait_for "Prometheus evaluates the weft recording rules (weft:variant_requests:rate1m)" recorded
rates=$(promq 'weft:variant_requests:rate1m{experiment="ranker-ab"}' |
  grep -o '"variant":"[^"]*"},"value":\[[^]]*\]' | sed -e 's/"variant":"//' -e 's/"},"value":\[[0-9.]*,"/=/' -e 's/"\]//' | tr '\n' ' ')
log "prometheus: recording rule weft:variant_requests:rate1m (req/s by variant): $rates"

ok=1
log "PASS"
