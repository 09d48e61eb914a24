#!/usr/bin/env bash
# Installs everything Thaw needs to build and test on Debian 12 (bookworm),
# then the Node test dependencies from package-lock.json.
#
# Idempotent: a second run with everything present touches neither apt nor npm.
# Run as root, or as a user with sudo (used only for apt and services).
#
# Environment:
#   THAW_SKIP_NPM=1   do not run npm ci (e.g. a C-only build machine)
set -euo pipefail

log() { printf '[install-deps] %s\n' "$*" >&2; }
die() { printf '[install-deps] ERROR: %s\n' "$*" >&2; exit 1; }
trap 'die "failed at line $LINENO (exit $?)"' ERR

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Exactly what the project uses; each name exists in bookworm main.
PACKAGES=(
  build-essential meson ninja-build pkg-config
  protobuf-c-compiler libprotobuf-c-dev
  libnghttp2-dev libevent-dev libjansson-dev libcmocka-dev
  libcurl4-openssl-dev libhiredis-dev libssl-dev openssl
  redis-server prometheus nghttp2-client wrk nginx-light valgrind
  curl ca-certificates jq
  # scripts/fuzz.sh: clang 14, its libFuzzer/sanitizer runtimes, llvm-symbolizer
  clang libclang-rt-14-dev llvm-14
)
# Packages whose maintainer scripts start a system service. Tests run their own
# instances on free ports, so a system copy is only in the way.
SERVICE_PACKAGES=(redis-server:redis-server prometheus:prometheus nginx-light:nginx)

if [ "$(id -u)" -eq 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1; then
  SUDO=(sudo)
else
  die "not root and sudo is not installed: run this script as root"
fi

[ -r /etc/debian_version ] || die "this installer is for Debian 12; /etc/debian_version not found"
command -v dpkg-query >/dev/null 2>&1 || die "dpkg-query not found: not a Debian system?"

# A machine may carry Node.js from elsewhere (e.g. a nodesource build that
# bundles npm and conflicts with Debian's npm package): keep what works.
if node --version >/dev/null 2>&1 && npm --version >/dev/null 2>&1; then
  log "node $(node --version) and npm $(npm --version) already work; not installing nodejs/npm"
else
  PACKAGES+=(nodejs npm)
fi

is_installed() {
  [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null || true)" = installed ]
}

missing=()
for p in "${PACKAGES[@]}"; do
  is_installed "$p" || missing+=("$p")
done

# True when the package lists are absent or older than a day, or when some
# wanted package has no install candidate in them.
apt_lists_stale() {
  local newest
  newest=$(find /var/lib/apt/lists -maxdepth 1 -type f \( -name '*_Packages*' -o -name '*Release' \) \
             -mmin -1440 -print -quit 2>/dev/null || true)
  if [ -z "$newest" ]; then
    log "apt package lists are missing or older than a day"
    return 0
  fi
  local p cand
  for p in "$@"; do
    cand=$(apt-cache policy "$p" 2>/dev/null | awk '/Candidate:/ {print $2}')
    if [ -z "$cand" ] || [ "$cand" = "(none)" ]; then
      log "no install candidate for $p in the current lists"
      return 0
    fi
  done
  return 1
}

apt_get() {
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get -o DPkg::Lock::Timeout=300 "$@"
}

# policy-rc.d exiting 101 tells invoke-rc.d (used by maintainer scripts) not to
# start services. Only ours is removed afterwards; an existing one is kept.
POLICY_RC=/usr/sbin/policy-rc.d
our_policy_rc=0
remove_policy_rc() {
  if [ "$our_policy_rc" -eq 1 ]; then
    "${SUDO[@]}" rm -f "$POLICY_RC" || true
    our_policy_rc=0
  fi
}

stop_new_services() {
  local entry pkg svc
  for entry in "${SERVICE_PACKAGES[@]}"; do
    pkg=${entry%%:*}
    svc=${entry#*:}
    case " ${missing[*]} " in *" $pkg "*) ;; *) continue ;; esac
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
      # Installed for tests only: keep it from starting now or at boot.
      log "disabling and stopping system service $svc (tests start their own)"
      "${SUDO[@]}" systemctl disable --now "$svc" >/dev/null 2>&1 || \
        log "warning: could not disable $svc"
    elif command -v service >/dev/null 2>&1; then
      if "${SUDO[@]}" service "$svc" status >/dev/null 2>&1; then
        log "stopping system service $svc (tests start their own)"
        "${SUDO[@]}" service "$svc" stop >/dev/null 2>&1 || log "warning: could not stop $svc"
      fi
    fi
  done
}

if [ "${#missing[@]}" -eq 0 ]; then
  log "all ${#PACKAGES[@]} Debian packages already installed; skipping apt"
else
  log "missing Debian packages: ${missing[*]}"
  if apt_lists_stale "${missing[@]}"; then
    log "running apt-get update"
    apt_get update -q || die "apt-get update failed"
  fi
  if [ ! -e "$POLICY_RC" ]; then
    printf '#!/bin/sh\n# temporary, from thaw scripts/install-deps.sh\nexit 101\n' | \
      "${SUDO[@]}" tee "$POLICY_RC" >/dev/null
    "${SUDO[@]}" chmod 0755 "$POLICY_RC"
    our_policy_rc=1
  fi
  trap 'remove_policy_rc' EXIT
  log "apt-get install ${missing[*]}"
  if ! apt_get install -y -q --no-install-recommends "${missing[@]}"; then
    # Lists that looked fresh can still name a superseded .deb; one retry.
    log "install failed; refreshing package lists and retrying once"
    apt_get update -q || die "apt-get update failed"
    apt_get install -y -q --no-install-recommends "${missing[@]}" || \
      die "apt-get install failed for: ${missing[*]}"
  fi
  stop_new_services
  remove_policy_rc
  for p in "${missing[@]}"; do
    is_installed "$p" || die "package $p is still not installed after apt-get install"
  done
  log "installed: ${missing[*]}"
fi

# Node test dependencies. The stamp records the lockfile and node version the
# tree was installed from, so an unchanged tree is not reinstalled.
if [ "${THAW_SKIP_NPM:-0}" = 1 ]; then
  log "THAW_SKIP_NPM=1: skipping npm ci"
  exit 0
fi
command -v node >/dev/null 2>&1 || die "node not found after install"
command -v npm >/dev/null 2>&1 || die "npm not found after install"
[ -f "$REPO_ROOT/package-lock.json" ] || die "package-lock.json not found in $REPO_ROOT"

stamp_file="$REPO_ROOT/node_modules/.thaw-install-stamp"
want_stamp=$(cat "$REPO_ROOT/package.json" "$REPO_ROOT/package-lock.json" | sha256sum | cut -d' ' -f1)
want_stamp="$want_stamp node-$(node --version)"
if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$want_stamp" ] && \
   [ -d "$REPO_ROOT/node_modules/@grpc/grpc-js" ]; then
  log "node_modules matches package-lock.json; skipping npm ci"
else
  log "running npm ci in $REPO_ROOT"
  # --ignore-scripts: no dependency may run install hooks (none is needed).
  (cd "$REPO_ROOT" && npm ci --ignore-scripts --no-audit --no-fund) || die "npm ci failed"
  printf '%s\n' "$want_stamp" >"$stamp_file"
  log "npm ci done"
fi
log "done"
