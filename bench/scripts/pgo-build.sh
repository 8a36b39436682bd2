#!/usr/bin/env bash
# A profile-guided build of weft-proxy: target/pgo/release/weft-proxy.
#
#   bench/scripts/pgo-build.sh            # then: WEFT_PROXY_BIN=target/pgo/release/weft-proxy \
#                                         #         cargo run --release -p weft-bench --bin proxy-load
#
# Why: callgrind with its cache simulation (`CALLGRIND_ARGS=--cache-sim=yes
# bench/scripts/callgrind-proxy.sh`) put the plain release build at 1.09 × nginx's instructions per
# request but 2.0 × its instruction-cache misses: the hot path's code is spread over many pages
# (tokio, http, weft's own generic futures), and no source change fixes layout. LLVM lays code
# out, inlines and splits hot from cold by a measured profile; bench/README.md ("Stop 33") has the
# figures.
#
# Steps: (1) an instrumented build (`-Cprofile-generate`), fat LTO and one codegen unit, in
# target/pgo-gen; (2) it serves a training load: the proxy-load bench's own config and upstream
# (two weighted variants, retries with a budget, breaker, outlier detection, metrics), 200,000
# HTTP/1.1 requests over 50 connections and 50,000 HTTP/2 requests over 10 connections, then a
# SIGTERM so the profile is written at exit; (3) `llvm-profdata merge`; (4) the optimized build,
# same settings plus `-Cprofile-use`, in target/pgo. About 10 minutes on 2 cores.
#
# Needs llvm-profdata of the LLVM that rustc was built with (`rustc -vV`; Debian's `llvm-N`
# package, installed here when missing and running as root), h2load (nghttp2-client), and
# target/release/proxy-load (`cargo build --release -p weft-bench --bin proxy-load`) for the
# upstream.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
llvm=$(rustc -vV | awk '/^LLVM version:/ { split($3, v, "."); print v[1] }')
profdata=""
for c in "llvm-profdata-$llvm" llvm-profdata; do
  if command -v "$c" > /dev/null && "$c" --version 2>/dev/null | grep -q "LLVM version $llvm\."; then profdata=$c; break; fi
done
if [ -z "$profdata" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
    echo "installing llvm-$llvm for llvm-profdata-$llvm (rustc uses LLVM $llvm)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y "llvm-$llvm" > /dev/null
    profdata=llvm-profdata-$llvm
  else
    echo "pgo-build: needs llvm-profdata for LLVM $llvm (rustc -vV); e.g. apt-get install llvm-$llvm" >&2
    exit 2
  fi
fi
command -v h2load > /dev/null || { echo "pgo-build: needs h2load (apt-get install nghttp2-client)" >&2; exit 2; }
[ -x target/release/proxy-load ] || cargo build --release -p weft-bench --bin proxy-load

data=$root/target/pgo-data
build() { # TARGET_DIR RUSTFLAGS
  CARGO_TARGET_DIR=$1 CARGO_PROFILE_RELEASE_LTO=fat CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 \
    RUSTFLAGS="$2" cargo build --release -p weft-proxy --bin weft-proxy
}

echo "1/4 instrumented build (target/pgo-gen)" >&2
build target/pgo-gen "-Cprofile-generate=$data"
rm -rf "$data" && mkdir -p "$data"   # build scripts ran instrumented too: their profiles go

echo "2/4 training load" >&2
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
coproc UP { exec target/release/proxy-load --serve-upstream 2; }
pids+=("$UP_PID")
read -r line <&"${UP[0]}"
read -r _ up_a up_b <<<"$line"
listen=127.0.0.1:$((20000 + RANDOM % 20000))
sed -e "s/{{ADMIN}}/127.0.0.1:0/" -e "s/{{LISTEN}}/$listen/" \
    -e "s/{{UPSTREAM_A}}/$up_a/" -e "s/{{UPSTREAM_B}}/$up_b/" bench/peers/weft.yaml > "$work/weft.yaml"
target/pgo-gen/release/weft-proxy --config "$work/weft.yaml" > "$work/proxy.log" 2>&1 &
proxy=$!
pids+=("$proxy")
for _ in $(seq 100); do
  if (exec 3<>"/dev/tcp/${listen%:*}/${listen#*:}") 2>/dev/null; then break; fi
  sleep 0.1
done
h2load --h1 -n 200000 -c 50 "http://$listen/" | grep -E "^requests:"
h2load -n 50000 -c 10 -m 10 "http://$listen/" | grep -E "^requests:"
kill -TERM "$proxy"
wait "$proxy" || { echo "pgo-build: the instrumented proxy did not exit cleanly:" >&2; tail "$work/proxy.log" >&2; exit 1; }

echo "3/4 merge" >&2
shopt -s nullglob
raw=("$data"/*.profraw)
[ ${#raw[@]} -gt 0 ] || { echo "pgo-build: the training run wrote no profile in $data" >&2; exit 1; }
"$profdata" merge -o "$work/merged.profdata" "${raw[@]}"
# Named by its content: cargo sees RUSTFLAGS, not the file, so a new profile under the same name
# would leave the dependencies built with the old one.
profile=$root/target/pgo-$(sha256sum "$work/merged.profdata" | cut -c1-16).profdata
mv "$work/merged.profdata" "$profile"

echo "4/4 optimized build (target/pgo)" >&2
build target/pgo "-Cprofile-use=$profile"
echo "target/pgo/release/weft-proxy"
