#!/usr/bin/env bash
# The main job: build the plugin (as it ships, scripts/build-plugin.sh) and its benchmark in
# release mode, then measure.
# - No RDMA NIC here (the default on dev and CI machines): boot the Soft-RoCE VM and print the
#   side-by-side table of perftest (ib_write_bw / ib_write_lat) and this plugin on rxe0.
# - RDMA NICs present: run nccl-net-bench on the first plugin device (two processes, loopback
#   rendezvous), NCCL-like pipelining, the table with bandwidth, message rate, latency, CPU.
#
# usage: scripts/run.sh [ARGS...]   ARGS go to bench-vs-perftest.sh (VM) or nccl-net-bench (NIC),
#                                   e.g. --plugin /other/libnccl-net.so to measure another plugin
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
command -v cargo >/dev/null || . "$HOME/.cargo/env"
"$repo/scripts/deps.sh" build >/dev/null
cargo build --release --bin nccl-net-bench
plugin="$(scripts/build-plugin.sh)"

if compgen -G "/sys/class/infiniband/*" >/dev/null; then
  has_plugin=0
  for a in "$@"; do [ "$a" = --plugin ] && has_plugin=1; done
  if [ "$has_plugin" = 1 ]; then
    exec target/release/nccl-net-bench "$@"
  fi
  exec target/release/nccl-net-bench --plugin "$plugin" "$@"
fi
echo "run.sh: no RDMA device on this machine; measuring on Soft-RoCE in the VM (a few minutes)" >&2
exec "$repo/scripts/rdma-vm.sh" scripts/bench-vs-perftest.sh "$@"
