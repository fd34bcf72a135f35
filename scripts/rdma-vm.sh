#!/usr/bin/env bash
# Run a command inside a Soft-RoCE VM and return its exit code.
#
# usage: scripts/rdma-vm.sh CMD [ARGS...]
#
# Boots Debian's kernel under qemu (software emulation, no KVM needed) with virtme-ng, sharing
# the host filesystem (the repository read-write), loads rdma_rxe, creates rxe0 on lo, and rxe1
# and rxe2 on the two ends of a veth pair (127.0.1.1 and 127.0.1.2; see vm-guest.sh), then runs
# CMD from the current directory. The VM has no other network device, so no traffic leaves it.
# Works without a TTY.
#
# Environment: NCCL_NET_RS_VM_TIMEOUT (seconds, default 2400), NCCL_NET_RS_VM_MEMORY (default 6G:
# the 2 GiB-message test pins a little over 2 GiB in each of two processes),
# NCCL_NET_RS_VM_CPUS (default 2).
set -euo pipefail

if [ "$#" -eq 0 ]; then
  echo "usage: $0 CMD [ARGS...]" >&2
  exit 2
fi
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
vng_bin="$("$repo/scripts/deps.sh" vm)"
export PATH="$vng_bin:$PATH"

kernel="$(ls -1 /boot/vmlinuz-* 2>/dev/null | sort -V | tail -n 1)"
if [ -z "$kernel" ]; then
  echo "rdma-vm: no kernel in /boot (is linux-image-amd64 installed?)" >&2
  exit 125
fi

work="$repo/target/vm/$$"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
# The command goes into a file: virtme-ng passes --exec on the kernel command line, which is cut
# at about 2 KB, and a cut command leaves the VM idle forever.
{
  printf 'cd %q\n' "$PWD"
  printf '%q ' "$@"
  printf '\n'
} >"$work/cmd.sh"

set +e
timeout --kill-after=30 "${NCCL_NET_RS_VM_TIMEOUT:-2400}" \
  vng --run "$kernel" --disable-kvm --cpus "${NCCL_NET_RS_VM_CPUS:-2}" \
  --memory "${NCCL_NET_RS_VM_MEMORY:-6G}" --rwdir "$repo" \
  --exec "bash $repo/scripts/vm-guest.sh $work" </dev/null
vng_rc=$?
set -e

if [ ! -f "$work/rc" ]; then
  echo "rdma-vm: the VM did not run the command (vng exit code $vng_rc; 124 = timed out)" >&2
  exit 125
fi
rc="$(cat "$work/rc")"
exit "$rc"
