#!/usr/bin/env bash
# Bandwidth at one message size, alternating ib_write_bw and nccl-net-bench RUNS times on one
# RDMA device, each line with the device's retransmission counters before and after (Soft-RoCE
# exposes them in hw_counters). Run it where the device is, e.g. in the VM:
#   scripts/rdma-vm.sh scripts/bw-repeat.sh 64K 4
#
# usage: scripts/bw-repeat.sh SIZE [RUNS] [DEV]   (SIZE: bytes, or with K/M; RUNS default 4;
#                                                  DEV default rxe0; 2,000 messages per run)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${1:-}" in
  *K) size=$((${1%K} << 10)) ;;
  *M) size=$((${1%M} << 20)) ;;
  [0-9]*) size=$(($1)) ;;
  *) echo "usage: $0 SIZE [RUNS] [DEV]" >&2; exit 2 ;;
esac
runs="${2:-4}" dev="${3:-rxe0}" iters=2000
counters=/sys/class/infiniband/$dev/ports/1/hw_counters
retries() { # requester retries and duplicate requests seen by the responder
  if [ -r "$counters/completer_retry_err" ]; then
    echo "retries $(cat "$counters/completer_retry_err") duplicates $(cat "$counters/duplicate_request")"
  else
    echo "no retry counters"
  fi
}
gid=0
for g in /sys/class/infiniband/$dev/ports/1/gids/*; do
  grep -q '0000:0000:0000:0000:0000:ffff' "$g" 2>/dev/null && { gid="${g##*/}"; break; }
done
for run in $(seq "$runs"); do
  before="$(retries)"
  port=$((18000 + RANDOM % 2000))
  ib_write_bw -d "$dev" -x "$gid" -p "$port" -s "$size" -n "$iters" -F >/dev/null 2>&1 &
  sleep 1
  mbps="$(ib_write_bw -d "$dev" -x "$gid" -p "$port" -s "$size" -n "$iters" -F 127.0.0.1 |
    awk -v s="$size" '$1 == s { print $4 }')"
  wait
  echo "run $run ib_write_bw    $mbps MB/s  [$before] -> [$(retries)]"
  before="$(retries)"
  mbps="$("$repo/target/release/nccl-net-bench" --plugin "$repo/target/plugin/libnccl_net.so" \
    --dev "$dev" --min "$size" --max "$size" --iters "$iters" --lat-iters 4 2>/dev/null |
    awk -v s="$size" '$1 == s { print $3 }')"
  echo "run $run nccl-net-bench $mbps MB/s  [$before] -> [$(retries)]"
done
