#!/usr/bin/env bash
# This build against an older build of the plugin, as during a rolling upgrade: builds COMMIT's
# library (a worktree under target/interop/), then, in the Soft-RoCE VM, runs nccl-net-bench
# with one build in each process, each build once as the sender, bytes verified, and shows what
# each side's log says about the eager path (negotiated off when either side lacks it).
#
#   cargo build --release --bin nccl-net-bench && scripts/build-plugin.sh
#   scripts/interop.sh 559dbf1          # the last commit before the eager path
#
# Needs the repository's history (a shallow clone lacks older commits), so CI does not run it.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" != "--in-vm" ]; then
  [ $# -eq 1 ] || { echo "usage: $0 COMMIT" >&2; exit 2; }
  commit=$(git -C "$root" rev-parse --short "$1^{commit}")
  src="$root/target/interop/$commit/src"
  if [ ! -d "$src" ]; then
    git -C "$root" worktree add --detach "$src" "$commit" >&2
  fi
  CARGO_TARGET_DIR="$root/target/interop/$commit/target" \
    cargo build --release --lib --locked --manifest-path "$src/Cargo.toml" >&2
  exec "$root/scripts/rdma-vm.sh" "$0" --in-vm \
    "$root/target/interop/$commit/target/release/libnccl_net.so"
fi

old=$2
new="$root/target/plugin/libnccl_net.so"
bench="$root/target/release/nccl-net-bench"
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
common=(--dev rxe0 --min 8 --max 1M --iters 200 --lat-iters 200 --verify)
port=47311
status=0

declare -A build=([new]="$new" [old]="$old")

# One run: the build named $1 sends (rank 0), the one named $2 receives; then extra arguments.
pair() {
  local sender=$1 receiver=$2 name="$1-sends${3:+ $3}"
  shift 2
  port=$((port + 1))
  NCCL_DEBUG=TRACE NCCL_NET_RS_LOG=nccl_net=debug "$bench" --plugin "${build[$sender]}" --role server \
    --rendezvous "127.0.0.1:$port" "${common[@]}" "$@" >"$logs/sender" 2>&1 &
  local server=$!
  NCCL_DEBUG=TRACE NCCL_NET_RS_LOG=nccl_net=debug "$bench" --plugin "${build[$receiver]}" --role client \
    --rendezvous "127.0.0.1:$port" "${common[@]}" "$@" >"$logs/receiver" 2>&1 ||
    { echo "receiver ($receiver) failed:"; tail -5 "$logs/receiver"; status=1; }
  wait "$server" || { echo "sender ($sender) failed:"; tail -5 "$logs/sender"; status=1; }
  echo "== $name: $sender build sends to the $receiver build"
  grep -hE "^ +[0-9]+ " "$logs/sender" || true
  grep -hoE "no eager messages|eager messages up to [0-9]+ bytes(, (no )?quiet receives)?" \
    "$logs/sender" "$logs/receiver" |
    sort | uniq -c || true
}

pair new old
pair old new
pair new old --recv-late
pair old new --recv-late
echo "interop: $([ "$status" = 0 ] && echo passed || echo FAILED)"
exit "$status"
