#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager and kube-scheduler v1.20.2 from Debian bookworm's
# `kubernetes` source package once, and caches them in $HOSTCYCLE_K8S_BIN
# (default ~/.cache/hostcycle/k8s-v1.20.2). About 8 minutes on 2 cores; skipped when cached
# binaries carry the current recipe stamp.
set -euo pipefail

CACHE="${HOSTCYCLE_CACHE:-$HOME/.cache/hostcycle}"
BIN="${HOSTCYCLE_K8S_BIN:-$CACHE/k8s-v1.20.2}"
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler)
SRC_VERSION="1.20.5+really1.20.2-1.1+deb12u1"

# Bump RECIPE whenever the build changes what the binaries do: cached binaries whose stamp
# ($BIN/.hostcycle-recipe) differs, or that have none, are rebuilt and replaced.
#   1: reflect2 v1.0.2 swap
#   2: + kube-openapi zero-value check removed (empty strings in custom resources read as null)
RECIPE="hostcycle-k8s-recipe-2"
STAMP="$BIN/.hostcycle-recipe"

log() { printf '\033[1m[build-k8s]\033[0m %s\n' "$*" >&2; }

have_all=1
for c in "${COMPONENTS[@]}"; do [ -x "$BIN/$c" ] || have_all=0; done
if [ "$have_all" = 1 ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$RECIPE" ]; then
  log "using cached control plane in $BIN ($RECIPE)"; exit 0
fi
if [ "$have_all" = 1 ]; then
  log "cached control plane in $BIN is not $RECIPE (stamp: $(cat "$STAMP" 2>/dev/null || echo none)); rebuilding"
fi

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
SRC_LIST=/etc/apt/sources.list.d/hostcycle-bookworm-src.sources
if [ ! -f "$SRC_LIST" ]; then
  log "adding a deb-src entry for bookworm main"
  printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    | $SUDO tee "$SRC_LIST" >/dev/null
  $SUDO apt-get update -qq
fi

WORK="$CACHE/k8s-build"
mkdir -p "$WORK"
cd "$WORK"
if ! ls kubernetes_*.orig.tar.* >/dev/null 2>&1; then
  log "downloading Debian source package kubernetes=$SRC_VERSION"
  apt-get source --download-only "kubernetes=$SRC_VERSION" >/dev/null
fi
TREE="$WORK/tree"
if [ ! -f "$TREE/.unpacked" ]; then
  rm -rf "$TREE"; mkdir -p "$TREE"
  log "unpacking the orig tarball (it carries vendor/)"
  tar -xf kubernetes_*.orig.tar.* -C "$TREE" --strip-components=1
  touch "$TREE/.unpacked"
fi
cd "$TREE"

# reflect2 v1.0.1 (vendored) crashes under Go >= 1.18 (SIGSEGV in mapiterinit on the first
# custom-resource create). Swap in Debian's v1.0.2.
R2_SRC=$(dpkg -L golang-github-modern-go-reflect2-dev | grep -E '/reflect2/[^/]+\.(go|s)$' | grep -v _test.go | head -1 | xargs dirname)
if [ ! -f vendor/github.com/modern-go/reflect2/.hostcycle-v1.0.2 ]; then
  log "replacing vendored reflect2 v1.0.1 with Debian's v1.0.2 from $R2_SRC"
  rm -f vendor/github.com/modern-go/reflect2/*.go vendor/github.com/modern-go/reflect2/*.s
  for f in "$R2_SRC"/*.go "$R2_SRC"/*.s; do
    [ -e "$f" ] || continue
    case "$f" in *_test.go) continue;; esac
    cp "$f" vendor/github.com/modern-go/reflect2/
  done
  touch vendor/github.com/modern-go/reflect2/.hostcycle-v1.0.2
fi

# The vendored kube-openapi (d219536, Nov 2020) treats any value for which
# reflect.DeepEqual(reflect.Zero(T), reflect.ValueOf(v)) holds as null. That compares the two
# reflect.Value headers, which never matched before Go 1.16. With Go 1.19 reflect.Zero and a
# decoded "" stored in an interface{} both point at the runtime's zeroVal, so they match and
# every empty string in a custom resource (or a CRD default) fails its `type: string` check as
# "null". Upstream removed the check (kubernetes/kube-openapi#230, March 2021); do the same.
KO_TYPE=vendor/k8s.io/kube-openapi/pkg/validation/validate/type.go
if grep -q 'reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data))' "$KO_TYPE"; then
  log "removing kube-openapi's zero-value-is-null check (empty strings) in $KO_TYPE"
  sed -i 's/^\tif data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data)) {$/\tif data == nil {/' "$KO_TYPE"
fi
if grep -q 'reflect.Zero(reflect.TypeOf(data))' "$KO_TYPE" || ! grep -qE '^\s+if data == nil \{$' "$KO_TYPE"; then
  log "could not patch $KO_TYPE (unexpected contents)"; exit 1
fi

export GOPATH="$TREE/.go" CGO_ENABLED=0 GOPROXY=off GOFLAGS=-mod=vendor
mkdir -p .go/src/k8s.io
[ -e .go/src/k8s.io/kubernetes ] || ln -s ../../.. .go/src/k8s.io/kubernetes
log "building ${COMPONENTS[*]} (about 8 minutes on 2 cores)"
make WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler" >"$WORK/build.log" 2>&1 || {
  log "build failed; last lines of $WORK/build.log:"; tail -30 "$WORK/build.log" >&2; exit 1; }
mkdir -p "$BIN"
for c in "${COMPONENTS[@]}"; do
  out=$(find _output -type f -name "$c" -perm -u+x | head -1)
  [ -n "$out" ] || { log "built tree has no $c binary; see $WORK/build.log"; exit 1; }
  cp "$out" "$BIN/$c.tmp" && mv "$BIN/$c.tmp" "$BIN/$c"
done
echo "$RECIPE" >"$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"
log "control plane cached in $BIN"
# The unpacked tree is large; keep the downloaded source, drop the tree.
rm -rf "$TREE"
