#!/usr/bin/env bash
# Installs everything hostcycle's tests and lab need on a fresh Debian bookworm machine.
# Idempotent: each step checks first and does nothing when its result is already there.
#   - Debian packages: etcd-server, golang-go, rsync, ipmitool, python3-venv, build helpers,
#     and the rest of deploy/Dockerfile's runtime packages (openssh-client, ca-certificates),
#     which crates/hostcycle/tests/runtime_image.rs runs as the image would
#   - a Python venv with sushy-tools (Redfish emulator) and pyghmi (IPMI BMC), every package
#     pinned by version and sha256 in scripts/python-requirements.txt
#   - kube-apiserver / kube-controller-manager / kube-scheduler v1.20.2 built from Debian's
#     `kubernetes` source package (scripts/build-k8s.sh), cached under $HOSTCYCLE_K8S_BIN.
#   - the install tools the deploy/ tests render with (scripts/install-tools.sh), cached under
#     $HOSTCYCLE_CACHE/tools: Helm 3 and 4, kubectl with its kustomize, promtool.
set -euo pipefail

CACHE="${HOSTCYCLE_CACHE:-$HOME/.cache/hostcycle}"
export HOSTCYCLE_CACHE="$CACHE"
mkdir -p "$CACHE"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

log() { printf '\033[1m[prereqs]\033[0m %s\n' "$*" >&2; }

apt_packages=(etcd-server golang-go rsync ipmitool python3-venv python3-pip dpkg-dev openssl
  golang-github-modern-go-reflect2-dev apache2-utils openssh-client ca-certificates)
# kubectl for lab users: Debian's kubernetes-client, unless the machine already has a kubectl
# (its package would conflict with Debian's).
if ! command -v kubectl >/dev/null 2>&1; then apt_packages+=(kubernetes-client); fi
missing=()
for p in "${apt_packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The etcd-server package starts a system etcd on :2379; tests run their own on free ports.
if command -v systemctl >/dev/null && systemctl is-active --quiet etcd 2>/dev/null; then
  $SUDO systemctl stop etcd || true
fi

VENV="$CACHE/venv"
# Only through the pinned list: pip's hash-checking mode refuses any package (a dependency
# too) whose version or file hash is not in it; wheels only, so no package's build code runs.
# The venv's own pip (Debian's) is used as it is: upgrading it would fetch an unpinned pip.
REQUIREMENTS="$(dirname "$0")/python-requirements.txt"
if [ ! -x "$VENV/bin/sushy-emulator" ] || ! "$VENV/bin/python" -c 'import pyghmi.ipmi.bmc' 2>/dev/null \
  || ! cmp -s "$REQUIREMENTS" "$VENV/.requirements"; then
  log "installing the Python venv at $VENV (sushy-tools, pyghmi) from scripts/python-requirements.txt"
  [ -x "$VENV/bin/python" ] || /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --require-hashes --only-binary=:all: -r "$REQUIREMENTS"
  cp "$REQUIREMENTS" "$VENV/.requirements"
fi

bash "$(dirname "$0")/build-k8s.sh"
bash "$(dirname "$0")/install-tools.sh"
log "prerequisites ready (cache: $CACHE)"
