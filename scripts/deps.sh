#!/usr/bin/env bash
# Install what building and testing need, idempotently: only missing Debian packages are
# installed, and the virtme-ng venv is created once.
#
# usage: scripts/deps.sh [build] [vm]
#   build  compilers and verbs headers for `cargo build` / `cargo test` on the host
#   vm     qemu, Debian's kernel (which has rdma_rxe), rdma-core tools and virtme-ng
# Prints the venv's bin directory on stdout when `vm` is given (for PATH).
set -euo pipefail

want_build=0 want_vm=0
for arg in "${@:-build}"; do
  case "$arg" in
    build) want_build=1 ;;
    vm) want_vm=1 ;;
    *) echo "deps.sh: unknown component '$arg' (expected build or vm)" >&2; exit 2 ;;
  esac
done

packages=()
if [ "$want_build" = 1 ]; then
  # rdma-sys runs bindgen (libclang) over the installed verbs headers and probes both
  # libibverbs and librdmacm with pkg-config; gcc and binutils build and inspect the C hosts.
  packages+=(libibverbs-dev librdmacm-dev ibverbs-providers clang libclang-dev pkg-config gcc binutils)
fi
if [ "$want_vm" = 1 ]; then
  packages+=(qemu-system-x86 linux-image-amd64 rdma-core ibverbs-utils ibverbs-providers perftest iproute2 kmod python3)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "deps.sh: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

if [ "$want_vm" = 1 ]; then
  venv="${NCCL_NET_RS_CACHE:-$HOME/.cache/nccl-net-rsib}/vng-venv"
  if [ ! -x "$venv/bin/vng" ]; then
    echo "deps.sh: installing virtme-ng into $venv" >&2
    python3 -m venv "$venv" >&2 || { apt-get install -y -qq python3-venv >&2 && python3 -m venv "$venv" >&2; }
    "$venv/bin/pip" install -q virtme-ng >&2
  fi
  echo "$venv/bin"
fi
