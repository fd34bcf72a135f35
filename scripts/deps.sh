#!/usr/bin/env bash
# Install what building and testing need, idempotently: only missing Debian packages are
# installed, and the virtme-ng venv is created once. Afterwards every program the scripts call
# is checked; a missing one fails here, by name, instead of obscurely in a later step.
#
# usage: scripts/deps.sh [build] [vm] [profile]
#   build  compilers and verbs headers for `cargo build` / `cargo test` on the host
#   vm     qemu, busybox (virtme-ng builds the VM's initramfs with it), Debian's kernel (which
#          has rdma_rxe), rdma-core tools, perftest, and virtme-ng
#   profile  strace, perf, valgrind, gcc, objdump and addr2line, for the per-call profiling in
#            docs/benchmarking.md (run inside the VM, which shares this filesystem); not needed by the tests
# Prints the venv's bin directory on stdout when `vm` is given (for PATH).
set -euo pipefail

want_build=0 want_vm=0 want_profile=0
for arg in "${@:-build}"; do
  case "$arg" in
    build) want_build=1 ;;
    vm) want_vm=1 ;;
    profile) want_profile=1 ;;
    *) echo "deps.sh: unknown component '$arg' (expected build, vm or profile)" >&2; exit 2 ;;
  esac
done

packages=()
if [ "$want_build" = 1 ]; then
  # rdma-sys runs bindgen (libclang) over the installed verbs headers and probes both
  # libibverbs and librdmacm with pkg-config; gcc and binutils build and inspect the C hosts;
  # dpkg-dev's dpkg-shlibdeps derives the packages' dependencies.
  packages+=(libibverbs-dev librdmacm-dev ibverbs-providers clang libclang-dev pkg-config gcc binutils
    dpkg-dev)
fi
if [ "$want_vm" = 1 ]; then
  packages+=(qemu-system-x86 busybox-static linux-image-amd64 rdma-core ibverbs-utils ibverbs-providers
    perftest iproute2 kmod procps util-linux python3 python3-venv)
fi
if [ "$want_profile" = 1 ]; then
  packages+=(strace linux-perf valgrind gcc binutils)
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

venv="${NCCL_NET_RS_CACHE:-$HOME/.cache/nccl-net-rsib}/vng-venv"
if [ "$want_vm" = 1 ] && [ ! -x "$venv/bin/vng" ]; then
  echo "deps.sh: installing virtme-ng into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q virtme-ng >&2
fi

# --- verification: every program the scripts call, by name --------------------------------------
problems=()
need() { # need PROGRAM [PATH-PREFIX]: PROGRAM must be on PATH (or in PATH-PREFIX)
  command -v "$1" >/dev/null 2>&1 || [ -x "${2:-/nonexistent}/$1" ] || problems+=("program '$1' is missing")
}
if [ "$want_build" = 1 ]; then
  for prog in cc gcc clang pkg-config nm readelf dpkg-shlibdeps dpkg-deb; do need "$prog"; done
  need ldconfig /sbin # libc-bin; outside root's PATH on Debian
  pkg-config --exists libibverbs librdmacm 2>/dev/null ||
    problems+=("pkg-config finds no libibverbs/librdmacm (libibverbs-dev, librdmacm-dev)")
fi
if [ "$want_vm" = 1 ]; then
  # setpriv: the doctor's VM tests drop CAP_IPC_LOCK and run as nobody to stage faults;
  # tc: they drop packets with netem.
  for prog in qemu-system-x86_64 busybox rdma ip tc modprobe sysctl timeout python3 setpriv \
    ib_write_bw ib_write_lat ibv_devices; do
    need "$prog"
  done
  need vng "$venv/bin"
  # rdma-vm.sh boots the newest kernel in /boot; its modules must carry rdma_rxe.
  kernel="$(ls -1 /boot/vmlinuz-* 2>/dev/null | sort -V | tail -n 1)"
  if [ -z "$kernel" ]; then
    problems+=("no kernel image in /boot (linux-image-amd64)")
  else
    version="${kernel#/boot/vmlinuz-}"
    for module in rdma_rxe sch_netem; do
      if ! find "/lib/modules/$version" -name "$module.ko*" 2>/dev/null | grep -q .; then
        problems+=("kernel $version in /boot has no $module module under /lib/modules/$version")
      fi
    done
  fi
fi
if [ "$want_profile" = 1 ]; then
  for prog in strace perf valgrind gcc objdump addr2line; do need "$prog"; done
fi
if [ "${#problems[@]}" -gt 0 ]; then
  for p in "${problems[@]}"; do echo "deps.sh: $p" >&2; done
  exit 1
fi

if [ "$want_vm" = 1 ]; then
  echo "$venv/bin"
fi
