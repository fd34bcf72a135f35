#!/usr/bin/env bash
# Side by side on one RDMA device, in one run: perftest's ib_write_bw and ib_write_lat, then
# nccl-net-bench through an ncclNet plugin, with the ratio per size. Run it where the device is
# (inside the Soft-RoCE VM: scripts/rdma-vm.sh scripts/bench-vs-perftest.sh).
#
# usage: scripts/bench-vs-perftest.sh [--plugin PATH.so] [--dev NAME] [--bytes BYTES] [--max BYTES]
#   --plugin  the plugin to measure (default: this repository's release build); any ncclNet v8
#             plugin works, so the same table compares plugins
#   --dev     RDMA device (default rxe0); the plugin device with that name is used
#   --bytes   bytes moved per size by both tools (default 128M)
#   --max     largest message (default 64M)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
plugin="$repo/target/release/libnccl_net.so"
bench="$repo/target/release/nccl-net-bench"
to_bytes() { # 64K, 16M, 1G or a plain number
  case "$1" in
    *K) echo $((${1%K} << 10)) ;;
    *M) echo $((${1%M} << 20)) ;;
    *G) echo $((${1%G} << 30)) ;;
    *) echo $(($1)) ;;
  esac
}
dev=rxe0 bytes=$((128 << 20)) max=$((64 << 20))
while [ $# -gt 0 ]; do
  case "$1" in
    --plugin) plugin="$2"; shift 2 ;;
    --dev) dev="$2"; shift 2 ;;
    --bytes) bytes="$(to_bytes "$2")"; shift 2 ;;
    --max) max="$(to_bytes "$2")"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
for tool in ib_write_bw ib_write_lat "$bench"; do
  command -v "$tool" >/dev/null || { echo "bench-vs-perftest: $tool is missing" >&2; exit 2; }
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

gid_index() { # the IPv4-mapped RoCE v2 GID, as the plugin chooses by default
  local d=/sys/class/infiniband/$1/ports/1
  for g in "$d"/gids/*; do
    i="${g##*/}"
    if grep -q '0000:0000:0000:0000:0000:ffff' "$g" 2>/dev/null &&
      grep -q 'v2' "$d/gid_attrs/types/$i" 2>/dev/null; then echo "$i"; return; fi
  done
  echo 0
}
gid="$(gid_index "$dev")"

iters_for() { # same bytes per size as nccl-net-bench --bytes, within 32..2000 messages
  local n=$((bytes / $1))
  [ "$n" -lt 32 ] && n=32
  [ "$n" -gt 2000 ] && n=2000
  echo "$n"
}

perftest() { # perftest TOOL SIZE ITERS -> the result line's fields
  local tool="$1" size="$2" iters="$3" port=$((18000 + RANDOM % 2000))
  "$tool" -d "$dev" -x "$gid" -s "$size" -n "$iters" -F -p "$port" >"$work/server" 2>&1 &
  local server=$!
  local tries=0
  until "$tool" -d "$dev" -x "$gid" -s "$size" -n "$iters" -F -p "$port" 127.0.0.1 >"$work/client" 2>&1; do
    tries=$((tries + 1))
    [ "$tries" -gt 50 ] && { kill "$server" 2>/dev/null; echo "$tool failed: $(tail -3 "$work/client")" >&2; return 1; }
    sleep 0.2
  done
  wait "$server" || true
  awk -v s="$size" '$1 == s && NF >= 5 { print; exit }' "$work/client"
}

echo "# device $dev (GID index $gid), $bytes bytes per size; perftest and $(basename "$plugin") in the same run" >&2
sizes=()
for ((s = 8; s <= max; s *= 2)); do sizes+=("$s"); done
declare -A pt_bw pt_lat
for s in "${sizes[@]}"; do
  echo "perftest: $s B" >&2
  # ib_write_bw's BW average is in MB/sec (2^20 bytes); convert to 10^6 bytes like the bench.
  pt_bw[$s]="$(perftest ib_write_bw "$s" "$(iters_for "$s")" | awk '$4 > 0 { printf "%.3f", $4 * 1.048576 }')"
  if [ "$s" -le 65536 ]; then
    pt_lat[$s]="$(perftest ib_write_lat "$s" 1000 | awk '$6 > 0 { print $6 }')"
  fi
done

echo "nccl-net-bench: $plugin" >&2
"$bench" --plugin "$plugin" --dev "$dev" --min 8 --max "$max" --bytes "$bytes" --json >"$work/bench.json" 2>"$work/bench.err" ||
  { cat "$work/bench.err" >&2; exit 1; }

for s in "${sizes[@]}"; do echo "$s ${pt_bw[$s]:--} ${pt_lat[$s]:--}"; done >"$work/perftest.txt"
python3 - "$work/bench.json" "$work/perftest.txt" <<'PY'
import json, sys
bench = json.load(open(sys.argv[1]))
rows = {r["size"]: r for r in bench["results"]}
print(f"# {bench['name']} ({bench['plugin']}) on {bench['device']}, {bench['inflight']} requests in flight")
print(f"{'size(B)':>10} {'ib_write_bw':>12} {'plugin':>10} {'ratio':>6}   {'ib_write_lat':>12} {'plugin':>10} {'ratio':>6}")
print(f"{'':>10} {'(MB/s)':>12} {'(MB/s)':>10} {'':>6}   {'(us)':>12} {'(us)':>10} {'':>6}")
for line in open(sys.argv[2]):
    size, pbw, plat = line.split()
    r = rows[int(size)]
    bw_ratio = f"{r['bw_mb_per_s'] / float(pbw):.2f}" if pbw != "-" else "-"
    lat_ratio = f"{r['lat_us'] / float(plat):.2f}" if plat != "-" else "-"
    print(f"{int(size):>10} {pbw:>12} {r['bw_mb_per_s']:>10.2f} {bw_ratio:>6}   {plat:>12} {r['lat_us']:>10.2f} {lat_ratio:>6}")
PY
