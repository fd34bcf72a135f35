#!/usr/bin/env bash
# Build the plugin (scripts/build-plugin.sh: as it ships, with LTO) and its doctor in release mode
# and install them under PREFIX:
#   lib/libnccl-net-rsib.so  (selected with NCCL_NET_PLUGIN=rsib)
#   lib/libnccl-net.so       (what NCCL opens when NCCL_NET_PLUGIN is unset)
#   bin/nccl-net-doctor      (node and pair checks; the same plugin code built in)
# Both are real files, not symlinks: ldconfig caches real files, and container layers copy them
# reliably.
#
# usage: scripts/install.sh PREFIX
set -euo pipefail

prefix="${1:?usage: scripts/install.sh PREFIX}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
command -v cargo >/dev/null || . "$HOME/.cargo/env"
"$repo/scripts/deps.sh" build >/dev/null

cargo build --release --bin nccl-net-doctor --manifest-path "$repo/Cargo.toml"
built="$("$repo/scripts/build-plugin.sh")"
install -D -m 0755 "$built" "$prefix/lib/libnccl-net-rsib.so"
install -m 0755 "$built" "$prefix/lib/libnccl-net.so"
install -D -m 0755 "$repo/target/release/nccl-net-doctor" "$prefix/bin/nccl-net-doctor"
echo "installed $prefix/lib/libnccl-net-rsib.so, $prefix/lib/libnccl-net.so and $prefix/bin/nccl-net-doctor"
