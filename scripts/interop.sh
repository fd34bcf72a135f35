#!/usr/bin/env bash
# This build against an older build of the plugin, as during a rolling upgrade: builds COMMIT's
# library (a worktree under target/interop/), then, in the Soft-RoCE VM, runs nccl-net-bench
# with one build in each process, each build once as the sender, bytes verified, with quiet
# receives off and on (NCCL_NET_RS_QUIET=1 on both sides), and shows what each side's log says
# about the eager path and quiet receives (negotiated off when either side lacks them) and port
# failover (a side that finds the peer not taking part says so). Run it against the previous
# release before each release, and state the result in the CHANGELOG entry.
#
#   cargo build --release --bin nccl-net-bench && scripts/build-plugin.sh
#   scripts/interop.sh 0e83c39          # 0.3.4
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
# With QUIET=1 in the environment, both sides offer quiet receives.
pair() {
  local sender=$1 receiver=$2 name="$1-sends${3:+ $3}${QUIET:+ quiet}"
  shift 2
  port=$((port + 1))
  local vars=(NCCL_DEBUG=TRACE NCCL_NET_RS_LOG=nccl_net=debug NCCL_NET_RS_QUIET="${QUIET:-0}")
  env "${vars[@]}" "$bench" --plugin "${build[$sender]}" --role server \
    --rendezvous "127.0.0.1:$port" "${common[@]}" "$@" >"$logs/sender" 2>&1 &
  local server=$!
  env "${vars[@]}" "$bench" --plugin "${build[$receiver]}" --role client \
    --rendezvous "127.0.0.1:$port" "${common[@]}" "$@" >"$logs/receiver" 2>&1 ||
    { echo "receiver ($receiver) failed:"; tail -5 "$logs/receiver"; status=1; }
  wait "$server" || { echo "sender ($sender) failed:"; tail -5 "$logs/sender"; status=1; }
  echo "== $name: $sender build sends to the $receiver build"
  grep -hE "^ +[0-9]+ " "$logs/sender" || true
  grep -hoE "no eager messages|eager messages up to [0-9]+ bytes(, (no )?quiet receives)?|no port failover on the connection" \
    "$logs/sender" "$logs/receiver" |
    sort | uniq -c || true
}

for QUIET in 0 1; do
  [ "$QUIET" = 1 ] || QUIET=
  pair new old
  pair old new
  pair new old --recv-late
  pair old new --recv-late
done
echo "interop: $([ "$status" = 0 ] && echo passed || echo FAILED)"
exit "$status"
