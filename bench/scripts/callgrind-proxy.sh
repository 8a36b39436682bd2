#!/usr/bin/env bash
# Instructions per proxied request, counted by callgrind: the measure for per-request CPU work
# that wall-clock A/B runs on this noisy 2-core VM cannot resolve (they drift ±10%).
#
#   bench/scripts/callgrind-proxy.sh [weft|min-proxy|nginx] [CONFIG] [REQUESTS]
#
# Needs: valgrind, h2load (nghttp2-client), and a release build of the workspace's binaries
# and examples (`cargo build --release --workspace --bins --examples`). CONFIG defaults to the
# proxy-load bench's weft config (bench/peers/weft.yaml; for nginx bench/peers/nginx.conf, run
# with `master_process off` so the one process under valgrind is the worker); its {{...}}
# placeholders are filled.
# Prints instructions per request (total Ir over the measured requests, after a warm-up that
# is not counted) and leaves the profile in $OUT (default /tmp/callgrind-proxy) for
# `callgrind_annotate --inclusive=yes $OUT/callgrind.out.*`.
# CALLGRIND_ARGS adds valgrind options (`--dump-instr=yes` for bench/scripts/atomics.py,
# `--cache-sim=yes` for simulated cache misses).
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${1:-weft}
default_config=bench/peers/weft.yaml
[ "$target" = nginx ] && default_config=bench/peers/nginx.conf
config=${2:-$default_config}
requests=${3:-20000}
out=${OUT:-/tmp/callgrind-proxy}
rel=${REL:-target/release}
rm -rf "$out" && mkdir -p "$out"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# The bench's own upstream: fixed 100-byte answers, two ports (one per variant).
coproc UP { exec target/release/proxy-load --serve-upstream 2; }
pids+=("$UP_PID")
read -r line <&"${UP[0]}"
read -r _ up_a up_b <<<"$line"

port=$((20000 + RANDOM % 20000))
listen=127.0.0.1:$port
case "$target" in
  weft)
    sed -e "s/{{ADMIN}}/127.0.0.1:0/" -e "s/{{LISTEN}}/$listen/" \
        -e "s/{{UPSTREAM_A}}/$up_a/" -e "s/{{UPSTREAM_B}}/$up_b/" "$config" > "$out/weft.yaml"
    cmd=("$rel/weft-proxy" --config "$out/weft.yaml") ;;
  min-proxy)
    cmd=("$rel/examples/min-proxy" "$listen" "$up_a") ;;
  nginx)
    mkdir -p "$out/nginx-body" "$out/nginx-proxy"
    sed -e "s|{{TMP}}|$out|g" -e "s/{{LISTEN}}/$listen/" -e "s/{{UPSTREAM_A}}/$up_a/" \
        -e "s/^daemon off;/daemon off;\nmaster_process off;/" "$config" > "$out/nginx.conf"
    cmd=(nginx -c "$out/nginx.conf" -e "$out/nginx-error.log") ;;
  *) echo "unknown target $target (weft|min-proxy|nginx)" >&2; exit 2 ;;
esac

valgrind --tool=callgrind ${CALLGRIND_ARGS:-} --callgrind-out-file="$out/callgrind.out.%p" "${cmd[@]}" 2> "$out/valgrind.log" &
pids+=("$!")
for _ in $(seq 100); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
  sleep 0.2
done
h2load --h1 -n 2000 -c 10 "http://$listen/" > /dev/null        # warm-up: pools, caches
callgrind_control -z > /dev/null
h2load --h1 -n "$requests" -c 10 "http://$listen/" | grep -E "^requests:|^status codes:"
callgrind_control -d > /dev/null
sleep 1
total=$(callgrind_annotate "$out"/callgrind.out.*.1 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1; exit}')
echo "$target: $total instructions over $requests requests = $((total / requests)) per request"
# With more events than Ir (e.g. --cache-sim=yes), each of them per request too.
callgrind_annotate "$out"/callgrind.out.*.1 2>/dev/null | awk -v n="$requests" '
  /^Events shown:/ { for (i = 3; i <= NF; i++) ev[i - 2] = $i; k = NF - 2 }
  /PROGRAM TOTALS/ && k > 1 { j = 0; for (i = 1; i <= NF && j < k; i++) { if ($i ~ /^\(/) continue; v = $i; gsub(",", "", v); printf "  %s %.1f", ev[++j], v / n }; print " per request"; exit }'
