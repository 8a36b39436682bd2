#!/usr/bin/env bash
# Builds the compose mesh's images without an image registry (see deploy/Dockerfile):
#
#   weft:local             weft-control, weftctl, weft-proxy, weft-model-sim, weft-k8s (release builds)
#   weft-tools:local       weft:local + bash, curl, sleep + deploy/loadgen.sh, deploy/setup.sh
#   weft-prometheus:local  Debian's prometheus binary and its classic web UI
#
# each FROM scratch plus the shared libraries the programs need (ldd), copied from this machine.
#
#   deploy/build-images.sh            # cargo build --release first only if a binary is missing
#   deploy/build-images.sh --cargo    # always run cargo build --release first
#
# Environment: WEFT_IMAGE_TAG (default `local`), WEFT_BASE (default `scratch`) and WEFT_RUNTIME
# (default `host`) are passed to the Dockerfile as the tag, BASE and RUNTIME. Prometheus comes
# from $PATH when installed, else from the Debian package, downloaded with `apt-get download`
# and unpacked (not installed: nothing is started or configured on this machine); curl is
# installed with apt-get when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TAG=${WEFT_IMAGE_TAG:-local}
BASE=${WEFT_BASE:-scratch}
RUNTIME=${WEFT_RUNTIME:-host}
CTX=$ROOT/target/docker
BIN=$ROOT/target/release
WEFT_BINS=(weft-control weftctl weft-proxy weft-model-sim weft-k8s) # not `weft` (demo): the mesh does not run it

say() { echo "build-images: $*" >&2; }
die() { say "error: $*"; exit 1; }

cargo_build=0
for a in "$@"; do
  case $a in
    --cargo) cargo_build=1 ;;
    -h|--help) sed -n '2,17p' "$0" | sed -E 's/^# ?//'; exit 0 ;;
    *) die "unknown argument $a (see --help)" ;;
  esac
done
for b in "${WEFT_BINS[@]}"; do [ -x "$BIN/$b" ] || cargo_build=1; done
if [ "$cargo_build" = 1 ]; then
  say "cargo build --release -p weft-control -p weft-proxy -p weft-k8s --bin weft-control --bin weftctl --bin weft-proxy --bin weft-model-sim --bin weft-k8s"
  cargo build --release -p weft-control -p weft-proxy -p weft-k8s --bin weft-control --bin weftctl --bin weft-proxy --bin weft-model-sim --bin weft-k8s
else
  # A source of a binary's crates newer than the binary: the images would get old code.
  for b in "${WEFT_BINS[@]}"; do
    case $b in weft-proxy|weft-model-sim) srcs=(proxy/src xds) ;; weft-k8s) srcs=(k8s/src control/src proxy/src xds) ;; *) srcs=(control/src proxy/src xds) ;; esac
    newer=$(find "${srcs[@]}" \( -name '*.rs' -o -name '*.proto' \) -newer "$BIN/$b" -print -quit 2>/dev/null || true)
    if [ -n "$newer" ]; then
      say "warning: $newer changed after target/release/$b was built; the images get the binaries as they are (--cargo rebuilds them first)"
      break
    fi
  done
fi
command -v docker >/dev/null || die "docker not found"

# The programs' shared libraries (and the dynamic loader), at their paths under $1.
copy_libs() {
  local root=$1; shift
  local f lib
  for f in "$@"; do
    # A static binary makes ldd fail ("not a dynamic executable"): nothing to copy.
    ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' || true
  done | sort -u | while read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
    echo "$lib"
  done
}

# One build context: $1 = image name; files/ must be filled by the caller, the rest is made
# here from the executables under files/.
finish_context() {
  local name=$1 dir=$CTX/$1 exes libs
  mapfile -t exes < <(find "$dir/files" -type f -perm -u+x)
  mkdir -p "$dir/runtime-host/etc/weft-image" "$dir/runtime-host/tmp" "$dir/runtime-base/etc/weft-image"
  chmod 1777 "$dir/runtime-host/tmp"
  libs=$(copy_libs "$dir/runtime-host" "${exes[@]}")
  # Name resolution: glibc ≥ 2.34 has the files and dns NSS modules built in (these files are
  # stubs then); older ones dlopen them, so they go in too (their dependencies are in libc).
  local lib
  for lib in /lib/x86_64-linux-gnu/libnss_dns.so.2 /lib/x86_64-linux-gnu/libnss_files.so.2 /lib/x86_64-linux-gnu/libresolv.so.2; do
    [ -e "$lib" ] && [ ! -e "$dir/runtime-host$lib" ] || continue
    mkdir -p "$dir/runtime-host$(dirname "$lib")"
    cp -L "$lib" "$dir/runtime-host$lib"
    libs+=$'\n'"$lib"
  done
  printf 'hosts: files dns\n' > "$dir/runtime-host/etc/nsswitch.conf"
  { echo "# $name: shared libraries copied from the build machine ($(uname -srm))"; echo "$libs"; } \
    > "$dir/runtime-host/etc/weft-image/$name-runtime.txt"
  echo "# $name: the base image provides the shared libraries" > "$dir/runtime-base/etc/weft-image/$name-runtime.txt"
}

build() {
  local name=$1 base=$2
  say "docker build $name:$TAG (BASE=$base RUNTIME=$RUNTIME)"
  docker build -q -f deploy/Dockerfile --build-arg "BASE=$base" --build-arg "RUNTIME=$RUNTIME" \
    -t "$name:$TAG" "$CTX/$name" 2> >(grep -v -e DEPRECATED -e 'legacy builder' -e buildx -e 'docs.docker.com/go/buildx' -e '^ *$' >&2) >/dev/null
}

rm -rf "$CTX"

# weft: the release binaries.
mkdir -p "$CTX/weft/files/usr/local/bin"
for b in "${WEFT_BINS[@]}"; do cp "$BIN/$b" "$CTX/weft/files/usr/local/bin/"; done
finish_context weft

# weft-tools (on top of weft): a shell, curl and sleep for the load generator and setup.
if ! command -v curl >/dev/null; then
  say "curl missing: apt-get install curl"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl >/dev/null
fi
mkdir -p "$CTX/weft-tools/files/usr/local/bin"
cp "$(command -v bash)" "$(command -v curl)" "$(command -v sleep)" "$CTX/weft-tools/files/usr/local/bin/"
cp deploy/loadgen.sh "$CTX/weft-tools/files/usr/local/bin/weft-loadgen"
cp deploy/setup.sh "$CTX/weft-tools/files/usr/local/bin/weft-setup"
chmod +x "$CTX/weft-tools/files/usr/local/bin/"*
finish_context weft-tools

# weft-prometheus: the Debian package's binary and the files of its web UI (templates, and the
# JavaScript/CSS it takes from Debian's libjs-* packages: only the files the pages load).
mkdir -p "$CTX/weft-prometheus/files/usr/local/bin"
if command -v prometheus >/dev/null && [ -d /usr/share/prometheus/web/templates ]; then
  prom_root=/
  cp "$(command -v prometheus)" "$CTX/weft-prometheus/files/usr/local/bin/"
else
  debs=$ROOT/target/docker-debs # kept between runs: downloaded once
  mkdir -p "$debs"
  if ! ls "$debs"/prometheus_*.deb >/dev/null 2>&1; then
    say "prometheus not installed: apt-get download prometheus and its web UI's libjs-* packages (unpacked, not installed)"
    ui_pkgs=$(apt-cache depends prometheus 2>/dev/null | awk '/Depends: (libjs|fonts)/ {print $2}' || true)
    if ! (cd "$debs" && apt-get download prometheus $ui_pkgs libjs-d3 >/dev/null 2>&1); then
      apt-get update -qq
      ui_pkgs=$(apt-cache depends prometheus 2>/dev/null | awk '/Depends: (libjs|fonts)/ {print $2}' || true)
      (cd "$debs" && apt-get download prometheus $ui_pkgs libjs-d3 >/dev/null 2>&1) ||
        (cd "$debs" && apt-get download prometheus >/dev/null 2>&1) || die "apt-get download prometheus failed"
    fi
  fi
  prom_root=$CTX/prometheus-root
  for d in "$debs"/*.deb; do dpkg-deb -x "$d" "$prom_root"; done
  cp "$prom_root/usr/bin/prometheus" "$CTX/weft-prometheus/files/usr/local/bin/"
fi
web=$prom_root/usr/share/prometheus/web
ui=$CTX/weft-prometheus/files/usr/share/prometheus/web
if [ -d "$web/templates" ]; then
  mkdir -p "$ui/static"
  cp -r "$web/templates" "$ui/"
  for d in css img js vendor; do [ -d "$web/static/$d" ] && cp -rL "$web/static/$d" "$ui/static/" 2>/dev/null; done
  missing=0
  for f in $(grep -rhoE 'static/[A-Za-z0-9./_-]+' "$web/templates" | sort -u); do
    [ -e "$ui/$f" ] && continue
    mkdir -p "$(dirname "$ui/$f")"
    cp -L "$web/$f" "$ui/$f" 2>/dev/null || missing=$((missing + 1))
  done
  [ "$missing" = 0 ] || say "warning: $missing files of the Prometheus web UI are missing (its HTTP API is unaffected)"
else
  say "warning: no Prometheus web UI files found (its HTTP API is unaffected)"
fi
rm -rf "$CTX/prometheus-root"
finish_context weft-prometheus

build weft "$BASE"
build weft-tools "weft:$TAG"
build weft-prometheus "$BASE"
docker image ls --format '{{.Repository}}:{{.Tag}}  {{.Size}}' | grep -E "^weft(-tools|-prometheus)?:$TAG " >&2 || true
