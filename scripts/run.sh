#!/usr/bin/env bash
# The main job on this machine: build the plugin, load it the way NCCL does, and show which
# devices it offers NCCL and why (NCCL_DEBUG=INFO). On a machine with RDMA NICs this runs on
# them; without any it runs inside the Soft-RoCE VM (rxe0, rxe1).
#
# usage: scripts/run.sh   (extra NCCL_* variables, e.g. NCCL_IB_HCA, are passed through)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
command -v cargo >/dev/null || . "$HOME/.cargo/env"
"$repo/scripts/deps.sh" build >/dev/null
cargo build --release --lib
host="$repo/target/release/plugin_host"
cc -std=c11 -O1 -I nccl-headers tests/c_host/plugin_host.c -o "$host" -ldl
plugin="$repo/target/release/libnccl_net.so"
nccl_env=(NCCL_DEBUG="${NCCL_DEBUG:-INFO}")
while IFS='=' read -r name value; do
  [ "$name" != NCCL_DEBUG ] && nccl_env+=("$name=$value")
done < <(env | grep '^NCCL_' || true)

if compgen -G "/sys/class/infiniband/*" >/dev/null; then
  exec env "${nccl_env[@]}" "$host" "$plugin"
fi
echo "run.sh: no RDMA device on this machine; running in the Soft-RoCE VM" >&2
exec "$repo/scripts/rdma-vm.sh" env "${nccl_env[@]}" "$host" "$plugin"
