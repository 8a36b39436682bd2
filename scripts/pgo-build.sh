#!/usr/bin/env bash
# weft-proxy's release build, profile-guided: target/pgo/release/weft-proxy.
#
#   scripts/pgo-build.sh                    # prints the binary's path last
#   scripts/pgo-build.sh --train-only BIN   # only the training load, against BIN (CI runs it
#                                           # on the release build so the training never rots)
#
# Why: the plain release build (thin LTO, 4 codegen units) spreads the request path's code
# (tokio, http, weft's generic futures) over many cache lines; callgrind's cache simulation put
# its instruction-cache misses at 2.0 × nginx's per request. LLVM lays code out, inlines and
# splits hot from cold by a measured profile: −22 % instructions and −60 % I1 misses per request
# (bench/README.md, "Stop 33" and "Stop 34"). `cargo build --release` stays the everyday build;
# this is the one to ship, and the one `proxy-load` measures as `weft`.
#
# Steps: (1) an instrumented build (`-Cprofile-generate`), fat LTO and one codegen unit, in
# target/pgo-gen; (2) it serves a training load; (3) `llvm-profdata merge`; (4) the optimized
# build, same settings plus `-Cprofile-use`, in target/pgo. About 8 minutes on 2 cores the first
# time. The profile is kept under the hash of the instrumented binary and the training inputs,
# so a rerun with nothing changed skips steps 2-4's work.
#
# The training load is a sidecar's, not a benchmark's: scripts/pgo/training.yaml (a sticky A/B
# experiment over two weft-model-sim servers with a shadow copy to a third, budgeted retries,
# breakers, outlier detection, tenant labels, a plain route) serving KServe v2 infer calls over
# HTTP/1.1 (with and without a unit id) and HTTP/2, model metadata reads through the A/B route,
# health checks on the plain route, SSE token streams, and request bodies larger than the retry
# buffer (streamed). The model servers fail 1 % of calls so retries and the error paths are
# exercised too.
#
# Needs llvm-profdata of the LLVM that rustc was built with (`rustc -vV`; Debian's `llvm-N`
# package), h2load (nghttp2-client) — both installed here when missing and running as root — and the
# release build of weft-model-sim (built here when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# Debian package PKG, installed as the benches install their peers (bench/src/install.rs): as root
# with apt-get, updating the package lists once if a fresh machine has none. Fails when it can't.
apt_install() { # PKG
  [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null || return 1
  echo "pgo-build: installing $1 (apt-get)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$1" > /dev/null 2>&1 ||
    { DEBIAN_FRONTEND=noninteractive apt-get update -q > /dev/null 2>&1 &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$1" > /dev/null; }
}
command -v h2load > /dev/null || apt_install nghttp2-client || true
command -v h2load > /dev/null || { echo "pgo-build: needs h2load (apt-get install nghttp2-client)" >&2; exit 2; }
# The workspace-wide build, as every bench builds it, so the model server does not make cargo
# compile the shared dependencies a second time with other features.
[ -x target/release/weft-model-sim ] || cargo build --release --workspace --bins

train() { # BIN: serves the training load with BIN until every load has run, then stops it
  local bin=$1
  work=$(mktemp -d)
  pids=()
  cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
  trap cleanup EXIT
  port() { echo $((20000 + RANDOM % 20000)); }
  wait_port() { # PORT
    for _ in $(seq 100); do
      if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
      sleep 0.1
    done
    echo "pgo-build: nothing listens on 127.0.0.1:$1" >&2; return 1
  }
  sims=()
  for error_rate in 0.01 0.01 0; do
    p=$(port)
    target/release/weft-model-sim --listen "127.0.0.1:$p" --model ranker --latency-ms 0 --jitter-ms 0 \
      --max-concurrency 0 --tokens-per-s 100000 --error-rate "$error_rate" > "$work/sim-$p.log" 2>&1 &
    pids+=("$!")
    sims+=("127.0.0.1:$p")
  done
  listen=127.0.0.1:$(port)
  sed -e "s/{{ADMIN}}/127.0.0.1:0/" -e "s/{{LISTEN}}/$listen/" -e "s/{{SIM_A}}/${sims[0]}/" \
      -e "s/{{SIM_B}}/${sims[1]}/" -e "s/{{SIM_SHADOW}}/${sims[2]}/" scripts/pgo/training.yaml > "$work/weft.yaml"
  for s in "${sims[@]}"; do wait_port "${s#*:}"; done
  "$bin" --config "$work/weft.yaml" > "$work/proxy.log" 2>&1 &
  proxy=$!
  pids+=("$proxy")
  wait_port "${listen#*:}"

  echo '{"id":"r1","inputs":[{"name":"input","datatype":"FP32","shape":[4],"data":[0.1,0.2,0.3,0.4]}]}' > "$work/infer.json"
  echo '{"model":"ranker","prompt":"hello there","max_tokens":24,"stream":true}' > "$work/sse.json"
  python3 -c 'import json,sys; json.dump({"id": "big", "inputs": [{"name": "input", "datatype": "FP32", "shape": [200000], "data": [0.5] * 200000}]}, sys.stdout)' > "$work/big.json"
  infer=http://$listen/v2/models/ranker/infer
  load() { # WHAT, then h2load's arguments: fails unless 90 % of the requests got a 2xx
    local what=$1; shift
    local out
    out=$(h2load "$@" -H 'content-type: application/json' -H 'x-tenant-id: t1')
    echo "$out" | awk -v what="$what" '/^requests:/ { total = $2; ok = $8 }
      END { printf "  %-34s %6d requests, %6d 2xx\n", what, total, ok; exit !(total > 0 && ok >= 0.9 * total) }' >&2 \
      || { echo "pgo-build: the training load '$what' failed:" >&2; echo "$out" >&2; tail "$work/proxy.log" >&2; return 1; }
  }
  load "HTTP/1.1 infer, sticky unit id" --h1 -n 60000 -c 50 -d "$work/infer.json" -H 'x-user-id: user-17' "$infer"
  load "HTTP/1.1 infer, weighted random" --h1 -n 60000 -c 50 -d "$work/infer.json" "$infer"
  load "HTTP/1.1 GET, A/B route" --h1 -n 60000 -c 50 "http://$listen/v2/models/ranker"
  load "HTTP/1.1 GET, plain route" --h1 -n 60000 -c 50 "http://$listen/v2/health/ready"
  load "HTTP/2 infer" -n 40000 -c 10 -m 10 -d "$work/infer.json" "$infer"
  load "HTTP/1.1 SSE completions" --h1 -n 3000 -c 20 -d "$work/sse.json" "http://$listen/v1/completions"
  load "HTTP/1.1 1.4 MB bodies (streamed)" --h1 -n 300 -c 4 -d "$work/big.json" "$infer"
  kill -TERM "$proxy"
  wait "$proxy" || { echo "pgo-build: the proxy under training did not exit cleanly:" >&2; tail "$work/proxy.log" >&2; exit 1; }
}

if [ "${1:-}" = --train-only ]; then
  [ -x "${2:-}" ] || { echo "pgo-build: --train-only needs a weft-proxy binary" >&2; exit 2; }
  train "$2"
  echo "pgo-build: the training load ran against $2" >&2
  exit 0
fi

llvm=$(rustc -vV | awk '/^LLVM version:/ { split($3, v, "."); print v[1] }')
profdata=""
for c in "llvm-profdata-$llvm" llvm-profdata; do
  if command -v "$c" > /dev/null && "$c" --version 2>/dev/null | grep -q "LLVM version $llvm\."; then profdata=$c; break; fi
done
if [ -z "$profdata" ]; then
  echo "pgo-build: rustc uses LLVM $llvm; llvm-profdata-$llvm comes with llvm-$llvm" >&2
  if apt_install "llvm-$llvm"; then
    profdata=llvm-profdata-$llvm
  else
    echo "pgo-build: needs llvm-profdata for LLVM $llvm (rustc -vV); e.g. apt-get install llvm-$llvm" >&2
    exit 2
  fi
fi

data=$root/target/pgo-data
build() { # TARGET_DIR RUSTFLAGS
  CARGO_TARGET_DIR=$1 CARGO_PROFILE_RELEASE_LTO=fat CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 \
    RUSTFLAGS="$2" cargo build --release -p weft-proxy --bin weft-proxy
}

echo "1/4 instrumented build (target/pgo-gen)" >&2
build target/pgo-gen "-Cprofile-generate=$data"

# Named by what made it: cargo sees RUSTFLAGS, not the file's content, so a new profile under an
# old name would leave the dependencies built with the old one; and an unchanged binary and
# training make the same profile, so it is reused.
key=$(cat target/pgo-gen/release/weft-proxy scripts/pgo/training.yaml scripts/pgo-build.sh | sha256sum | cut -c1-16)
profile=$root/target/pgo-$key.profdata
if [ -f "$profile" ]; then
  echo "2/4, 3/4: the profile for this build and training exists ($profile)" >&2
else
  rm -rf "$data" && mkdir -p "$data"   # build scripts ran instrumented too: their profiles go
  echo "2/4 training load" >&2
  train target/pgo-gen/release/weft-proxy
  echo "3/4 merge" >&2
  shopt -s nullglob
  raw=("$data"/*.profraw)
  [ ${#raw[@]} -gt 0 ] || { echo "pgo-build: the training run wrote no profile in $data" >&2; exit 1; }
  # Renamed into place only once whole: a profile under its final name is reused as is.
  "$profdata" merge -o "$profile.partial" "${raw[@]}"
  mv "$profile.partial" "$profile"
fi

echo "4/4 optimized build (target/pgo)" >&2
build target/pgo "-Cprofile-use=$profile"
echo "target/pgo/release/weft-proxy"
