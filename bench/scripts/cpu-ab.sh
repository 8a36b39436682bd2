#!/usr/bin/env bash
# CPU per proxied request (user and system µs, from /proc/PID/stat) of weft-proxy builds,
# interleaved in rounds so drift on a noisy VM hits every build alike. The proxy runs pinned
# to core 0; the bench upstream and h2load share core 1 (as in proxy-load).
#
#   bench/scripts/cpu-ab.sh [-r ROUNDS] [-n REQUESTS] [-c CONNECTIONS] NAME=BINARY [NAME=BINARY...]
#
# CONNECTIONS (default 10) is h2load's -c; proxy-load's closed loop uses 50.
#
# BINARY is a weft-proxy binary, the hyper floor (target/release/examples/min-proxy), or the
# word `nginx` or `haproxy` for the proxy-load bench's nginx or HAProxy as a yardstick. Needs h2load (nghttp2-client), taskset, and target/release/proxy-load built.
#
# Like proxy-load, it runs in a network namespace of its own (loopback only, away from the host's
# firewall) when it can create one (root); HOST_NETWORK=1 measures on the host's loopback.
set -euo pipefail
if [ -z "${CPU_AB_NETNS:-}" ] && [ "${HOST_NETWORK:-0}" != 1 ] && unshare -n true 2>/dev/null; then
  exec env CPU_AB_NETNS=1 unshare -n sh -c 'ip link set lo up && exec "$0" "$@"' "$0" "$@"
fi
cd "$(dirname "$0")/../.."
rounds=3 requests=100000 conns=10
while getopts "r:n:c:" o; do case $o in r) rounds=$OPTARG ;; n) requests=$OPTARG ;; c) conns=$OPTARG ;; *) exit 2 ;; esac; done
shift $((OPTIND - 1))
[ $# -gt 0 ] || { echo "usage: $0 [-r ROUNDS] [-n REQUESTS] [-c CONNECTIONS] NAME=BINARY..." >&2; exit 2; }
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

coproc UP { exec taskset -c 1 target/release/proxy-load --serve-upstream 2; }
pids+=("$UP_PID")
read -r line <&"${UP[0]}"
read -r _ up_a up_b <<<"$line"
tck=$(getconf CLK_TCK)
cpu() { awk -v t="$tck" '{print ($14 * 1e6 / t) " " ($15 * 1e6 / t)}' "/proc/$1/stat"; }

for round in $(seq "$rounds"); do
  for spec in "$@"; do
    name=${spec%%=*} bin=${spec#*=}
    port=$((20000 + RANDOM % 20000)) listen=127.0.0.1:$port
    render() { sed -e "s#{{ADMIN}}#127.0.0.1:0#" -e "s#{{LISTEN}}#$listen#" -e "s#{{UPSTREAM_A}}#$up_a#" \
                   -e "s#{{UPSTREAM_B}}#$up_b#" -e "s#{{TMP}}#$tmp#g" "$1"; }
    if [ "${bin##*/}" = min-proxy ]; then
      taskset -c 0 "$bin" "$listen" "$up_a" & p=$!
    elif [ "$bin" = nginx ]; then
      render bench/peers/nginx.conf > "$tmp/nginx.conf"
      taskset -c 0 nginx -c "$tmp/nginx.conf" -p "$tmp" 2>/dev/null & p=$!
    elif [ "$bin" = haproxy ]; then
      render bench/peers/haproxy.cfg > "$tmp/haproxy.cfg"
      taskset -c 0 haproxy -f "$tmp/haproxy.cfg" -db 2>/dev/null & p=$!
    else
      render bench/peers/weft.yaml > "$tmp/weft.yaml"
      taskset -c 0 "$bin" --config "$tmp/weft.yaml" 2>/dev/null & p=$!
    fi
    pids+=("$p")
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
    worker=$p
    [ "$bin" = nginx ] && worker=$(pgrep -P "$p" | head -1)
    taskset -c 1 h2load --h1 -n 5000 -c "$conns" "http://$listen/" > /dev/null
    read -r u0 s0 < <(cpu "$worker")
    t0=$(date +%s.%N)
    ok=$(taskset -c 1 h2load --h1 -n "$requests" -c "$conns" "http://$listen/" | awk '/^status codes:/ {print $3}')
    t1=$(date +%s.%N)
    read -r u1 s1 < <(cpu "$worker")
    kill "$p"; wait "$p" 2>/dev/null || true
    awk -v n="$name" -v r="$round" -v ok="$ok" -v u="$((${u1%.*} - ${u0%.*}))" -v s="$((${s1%.*} - ${s0%.*}))" -v t0="$t0" -v t1="$t1" \
      'BEGIN {w = t1 - t0; printf "round %d %-10s user %6.2f  sys %6.2f  total %6.2f µs/req  %7.0f req/s  (%s 2xx)\n", r, n, u/ok, s/ok, (u+s)/ok, ok/w, ok}'
  done
done
