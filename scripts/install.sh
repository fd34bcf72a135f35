#!/usr/bin/env bash
# Build the plugin in release mode and install it under PREFIX/lib as
#   libnccl-net-rsib.so  (selected with NCCL_NET_PLUGIN=rsib)
#   libnccl-net.so       (what NCCL opens when NCCL_NET_PLUGIN is unset)
# Both are real files, not symlinks: ldconfig caches real files, and container layers copy them
# reliably.
#
# usage: scripts/install.sh PREFIX
set -euo pipefail

prefix="${1:?usage: scripts/install.sh PREFIX}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
command -v cargo >/dev/null || . "$HOME/.cargo/env"
"$repo/scripts/deps.sh" build >/dev/null

cargo build --release --lib --manifest-path "$repo/Cargo.toml"
built="$repo/target/release/libnccl_net.so"
install -D -m 0755 "$built" "$prefix/lib/libnccl-net-rsib.so"
install -m 0755 "$built" "$prefix/lib/libnccl-net.so"
echo "installed $prefix/lib/libnccl-net-rsib.so and $prefix/lib/libnccl-net.so"
