#!/usr/bin/env bash
# This plugin against another ncclNet plugin on one RDMA device, interleaved: each run is one
# nccl-net-bench --interleave (both plugins in the same two processes, measured in blocks that
# alternate A B, B A, ...), and the runs swap which plugin is A. Prints per size each plugin's
# median block and the ratio ours/theirs of every block pair, pooled over the runs: median
# [quartiles], and the lowest and highest of the runs' own medians. Run it where the device is
# (inside the Soft-RoCE VM: scripts/rdma-vm.sh scripts/bench-interleaved.sh --against ...).
#
# Why: on a shared host whose speed drifts by a factor of two within seconds, separate runs of
# two plugins (bench-vs-perftest.sh --against) meet different moments; two blocks of a pair run
# milliseconds apart. Each process's setup (buffer placement, queue pair numbers) still shifts
# one run's ratios by a few per cent, which swapping the positions and pooling the runs evens out.
#
# usage: scripts/bench-interleaved.sh --against PATH.so [--plugin PATH.so] [--preload LIB]
#          [--runs N] [--dev NAME] [--min BYTES] [--max BYTES] [--blocks N] [--iters N] [--lat-iters N]
#          [--inflight N] [--bench PATH] [--recv-late | --recv-preposted] [--json]
#   --plugin   the plugin to measure (default: target/plugin/libnccl_net.so, as it ships)
#   --against  the other plugin (any ncclNet v8..v12)
#   --preload  LD_PRELOAD for every run (a .so, or a .c compiled here): both plugins share the
#              processes, e.g. scripts/rxe-realpath.c for the reference on rxe
#   --runs     benchmark runs, positions swapped each time (default 4)
#   --dev      RDMA device (default rxe0), the plugin device with that name in both plugins
#   --min      smallest message (default 8)
#   --max      largest message (default 4K)
#   --blocks   blocks per size and phase in each run (default 200)
#   --iters, --lat-iters  messages and ping-pong rounds per size, phase and plugin in each run,
#              split over the blocks (default 8000 each)
#   --inflight requests in flight in the bandwidth phase (default 8, as NCCL)
#   --bench    the nccl-net-bench binary (default: the release build)
#   --recv-late, --recv-preposted  the benchmark's ping-pong modes
#   --json     print one JSON object instead of the table
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
plugin="$repo/target/plugin/libnccl_net.so"
bench="$repo/target/release/nccl-net-bench"
against="" preload="" runs=4 dev=rxe0 min=8 max=4K blocks=200 iters=8000 lat_iters=8000 inflight=8
json=0 ping_arg=()
while [ $# -gt 0 ]; do
  case "$1" in
    --plugin) plugin="$2"; shift 2 ;;
    --against) against="$2"; shift 2 ;;
    --preload) preload="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --dev) dev="$2"; shift 2 ;;
    --min) min="$2"; shift 2 ;;
    --max) max="$2"; shift 2 ;;
    --blocks) blocks="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --lat-iters) lat_iters="$2"; shift 2 ;;
    --inflight) inflight="$2"; shift 2 ;;
    --bench) bench="$2"; shift 2 ;;
    --recv-late | --recv-preposted) ping_arg=("$1"); shift ;;
    --json) json=1; shift ;;
    *) echo "bench-interleaved: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$against" ] || { echo "bench-interleaved: --against PATH.so is required" >&2; exit 2; }
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "bench-interleaved: --runs must be a positive number" >&2; exit 2; }
for tool in python3 "$bench"; do
  command -v "$tool" >/dev/null || { echo "bench-interleaved: $tool is missing" >&2; exit 2; }
done
for lib in "$plugin" "$against"; do
  [ -f "$lib" ] || { echo "bench-interleaved: no plugin at $lib (scripts/build-plugin.sh builds this one)" >&2; exit 2; }
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [ -n "$preload" ] && [ "${preload%.c}" != "$preload" ]; then
  command -v gcc >/dev/null || { echo "bench-interleaved: gcc is missing (to build $preload)" >&2; exit 2; }
  gcc -shared -fPIC -O2 -o "$work/preload.so" "$preload" -ldl
  preload="$work/preload.so"
fi

for ((run = 1; run <= runs; run++)); do
  # Odd runs: ours is A; even runs: theirs is A.
  if ((run % 2)); then a="$plugin" b="$against"; else a="$against" b="$plugin"; fi
  echo "bench-interleaved: run $run of $runs, A = $a" >&2
  LD_PRELOAD="$preload" "$bench" --plugin "$a" --interleave "$b" --dev "$dev" --min "$min" --max "$max" \
    --blocks "$blocks" --iters "$iters" --lat-iters "$lat_iters" --inflight "$inflight" \
    "${ping_arg[@]}" --json >"$work/run.$run.json" 2>"$work/run.$run.err" ||
    { echo "bench-interleaved: run $run failed:" >&2; cat "$work/run.$run.err" >&2; exit 1; }
done

python3 - "$work" "$runs" "$json" <<'PY'
import json, statistics, sys
work, runs, as_json = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"

def quartiles(vs):
    vs = sorted(vs)
    def at(p):
        x = p * (len(vs) - 1)
        lo, hi = int(x), min(int(x) + 1, len(vs) - 1)
        return vs[lo] + (vs[hi] - vs[lo]) * (x - lo)
    return [at(0.25), at(0.5), at(0.75)]

docs = [json.load(open(f"{work}/run.{r}.json")) for r in range(1, runs + 1)]
# In each run, the index (0: A, 1: B) of our plugin's blocks: A in odd runs.
ours_at = [0 if r % 2 == 0 else 1 for r in range(runs)]
ours, theirs = docs[0]["a"], docs[0]["b"]
rows = []
for k, size in enumerate(r["size"] for r in docs[0]["results"]):
    row = {"size": size}
    for phase, key in (("bw", "bw_mb_per_s"), ("lat", "lat_us")):
        pairs, per_run, mine, other = [], [], [], []
        for doc, i in zip(docs, ours_at):
            blocks = doc["results"][k]["blocks"][key]
            ratios = [o / t for o, t in zip(blocks[i], blocks[1 - i])]
            pairs += ratios
            per_run.append(statistics.median(ratios))
            mine += blocks[i]
            other += blocks[1 - i]
        q = quartiles(pairs)
        row[phase] = {"ours": statistics.median(mine), "theirs": statistics.median(other),
                      "ratio": {"q1": q[0], "median": q[1], "q3": q[2]},
                      "run_medians": per_run}
    rows.append(row)
doc = {"device": ours["device"], "runs": runs, "blocks": docs[0]["blocks"], "ping": docs[0]["ping"],
       "inflight": docs[0]["inflight"], "plugin": ours, "against": theirs, "results": rows}
if as_json:
    print(json.dumps(doc, allow_nan=False))
    sys.exit(0)
print(f"# {ours['name']} ({ours['plugin']}, ncclNet v{ours['abi']}) against {theirs['name']} "
      f"({theirs['plugin']}, v{theirs['abi']}) on {ours['device']}: {runs} interleaved runs, "
      f"positions swapped each run, {doc['blocks']} block pairs per size and phase in each, "
      f"{doc['inflight']} in flight, ping-pong receives {doc['ping']}")
print("# bw in MB/s, lat in us (half the round trip): each plugin's median block over all runs;"
      " ratio: ours/theirs per block pair, pooled: median [quartiles]; runs: lowest-highest of the runs' medians")
print(f"{'size(B)':>9} {'bw':>8} {'bw.vs':>8} {'bw ratio':>22} {'runs':>11}"
      f" {'lat':>8} {'lat.vs':>8} {'lat ratio':>22} {'runs':>11}")
for r in rows:
    cells = []
    for phase in ("bw", "lat"):
        p, q = r[phase], r[phase]["ratio"]
        cells.append(f"{p['ours']:>8.2f} {p['theirs']:>8.2f}"
                     f" {q['median']:>6.3f} [{q['q1']:.3f}, {q['q3']:.3f}]"
                     f" {min(p['run_medians']):>5.3f}-{max(p['run_medians']):.3f}")
    print(f"{r['size']:>9} " + " ".join(cells))
PY
