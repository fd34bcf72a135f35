#!/usr/bin/env bash
# Side by side on one RDMA device, in one run: perftest's ib_write_bw (bandwidth, and message
# rate with one write per message) and ib_write_lat, then nccl-net-bench through an ncclNet
# plugin and, with --against, through another plugin too, all three in turn, several times;
# prints medians and ratios per size and, with more than one run, the spread of the paired
# ratios (run i of the plugin over run i of perftest, and of the other plugin). Run it where the
# device is (inside the Soft-RoCE VM: scripts/rdma-vm.sh scripts/bench-vs-perftest.sh ...).
#
# usage: scripts/bench-vs-perftest.sh [--plugin PATH.so] [--against PATH.so [--preload LIB]]
#          [--runs N] [--dev NAME] [--bytes BYTES] [--max BYTES] [--inflight N] [--bench PATH]
#          [--recv-late | --recv-preposted] [--plugin-env VAR=VALUE]... [--json]
#   --plugin   the plugin to measure (default: this repository's plugin as it ships,
#              target/plugin/libnccl_net.so from scripts/build-plugin.sh)
#   --against  a second plugin, measured the same way in the same run (any ncclNet v8..v12)
#   --preload  LD_PRELOAD for the --against plugin's runs only (a .so, or a .c compiled here),
#              e.g. scripts/rxe-realpath.c for the reference plugin on rxe
#   --runs     rounds of perftest, the plugin and the other plugin in turn (default 3 with
#              --against, else 1); medians
#   --dev      RDMA device (default rxe0); the plugin device with that name is used
#   --bytes    bytes moved per size by both tools (default 128M)
#   --max      largest message (default 64M)
#   --inflight requests in flight in the benchmark's bandwidth phase (default 8, as NCCL)
#   --bench    the nccl-net-bench binary (default: the release build)
#   --recv-late  the benchmark's late-receive ping-pong (receives posted only when awaited)
#   --recv-preposted  the benchmark's ping-pong in batches whose receives are posted before the
#              timed rounds (no clear-to-send travels while they run)
#   --plugin-env VAR=VALUE for the --plugin runs only (repeatable), e.g. to compare this
#              plugin with a knob against itself without: --against the same library
#   --json     print one JSON object instead of the table
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
plugin="$repo/target/plugin/libnccl_net.so"
bench="$repo/target/release/nccl-net-bench"
to_bytes() { # 64K, 16M, 1G or a plain number
  case "$1" in
    *K) echo $((${1%K} << 10)) ;;
    *M) echo $((${1%M} << 20)) ;;
    *G) echo $((${1%G} << 30)) ;;
    *) echo $(($1)) ;;
  esac
}
dev=rxe0 bytes=$((128 << 20)) max=$((64 << 20)) inflight=8 against="" preload="" runs="" json=0
ping=ahead plugin_env=()
while [ $# -gt 0 ]; do
  case "$1" in
    --plugin) plugin="$2"; shift 2 ;;
    --against) against="$2"; shift 2 ;;
    --preload) preload="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --dev) dev="$2"; shift 2 ;;
    --bytes) bytes="$(to_bytes "$2")"; shift 2 ;;
    --max) max="$(to_bytes "$2")"; shift 2 ;;
    --inflight) inflight="$2"; shift 2 ;;
    --bench) bench="$2"; shift 2 ;;
    --recv-late) ping=late; shift ;;
    --recv-preposted) ping=preposted; shift ;;
    --plugin-env) plugin_env+=("$2"); shift 2 ;;
    --json) json=1; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
runs="${runs:-$([ -n "$against" ] && echo 3 || echo 1)}"
ping_arg=() # the benchmark's flag for the ping-pong (none for the default)
[ "$ping" = ahead ] || ping_arg=(--recv-"$ping")
for tool in ib_write_bw ib_write_lat python3 "$bench"; do
  command -v "$tool" >/dev/null || { echo "bench-vs-perftest: $tool is missing" >&2; exit 2; }
done
for lib in "$plugin" ${against:+"$against"}; do
  [ -f "$lib" ] || { echo "bench-vs-perftest: no plugin at $lib (scripts/build-plugin.sh builds this one)" >&2; exit 2; }
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if [ -n "$preload" ] && [ "${preload%.c}" != "$preload" ]; then
  gcc -shared -fPIC -O2 -o "$work/preload.so" "$preload" -ldl
  preload="$work/preload.so"
fi

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
  # The server may take seconds to listen on a loaded host: the client retries while the server
  # waits, for up to 60 s (a server that exited, e.g. after a failed run, ends it at once).
  local tries=0
  until "$tool" -d "$dev" -x "$gid" -s "$size" -n "$iters" -F -p "$port" 127.0.0.1 >"$work/client" 2>&1; do
    tries=$((tries + 1))
    if [ "$tries" -gt 300 ] || ! kill -0 "$server" 2>/dev/null; then
      kill "$server" 2>/dev/null
      echo "$tool failed: $(tail -3 "$work/client")" >&2
      return 1
    fi
    sleep 0.2
  done
  wait "$server" || true
  awk -v s="$size" '$1 == s && NF >= 5 { print; exit }' "$work/client"
}

echo "# device $dev (GID index $gid), $bytes bytes per size, $runs run(s) of each tool" >&2
sizes=()
for ((s = 8; s <= max; s *= 2)); do sizes+=("$s"); done
perftest_sweep() { # perftest_sweep RUN -> perftest.RUN.txt: size, bw, msg/s, lat per line
  local run="$1"
  for s in "${sizes[@]}"; do
    echo "perftest run $run: $s B" >&2
    # ib_write_bw's BW average is in MB/sec (2^20 bytes); convert to 10^6 bytes like the bench.
    # Its MsgRate (Mpps) is the device's rate of single writes, one work request per post.
    read -r bw msgs < <(perftest ib_write_bw "$s" "$(iters_for "$s")" |
      awk '$4 > 0 { printf "%.3f %.0f\n", $4 * 1.048576, $5 * 1e6 }') || true
    lat=-
    if [ "$s" -le 65536 ]; then
      lat="$(perftest ib_write_lat "$s" 1000 | awk '$6 > 0 { print $6 }')"
    fi
    echo "$s ${bw:--} ${msgs:--} ${lat:--}"
  done >"$work/perftest.$run.txt"
}

sweep() { # sweep NAME PLUGIN RUN [VAR=VALUE...]
  local name="$1" lib="$2" run="$3"
  shift 3
  echo "nccl-net-bench run $run: $name ($lib${*:+, $*})" >&2
  env "$@" "$bench" --plugin "$lib" --dev "$dev" --min 8 --max "$max" --bytes "$bytes" \
    --inflight "$inflight" "${ping_arg[@]}" --json >"$work/$name.$run.json" 2>"$work/$name.$run.err" ||
    { cat "$work/$name.$run.err" >&2; exit 1; }
}
# Each round runs the three in turn, so that run i of each meets about the same moment of a
# host whose speed drifts.
for ((run = 1; run <= runs; run++)); do
  perftest_sweep "$run"
  sweep plugin "$plugin" "$run" "${plugin_env[@]}"
  [ -n "$against" ] && sweep against "$against" "$run" "LD_PRELOAD=$preload"
done

python3 - "$work" "$runs" "$json" "$([ -n "$against" ] && echo 1 || echo 0)" "$ping" "${plugin_env[@]}" <<'PY'
import json, math, statistics, sys
work, runs, as_json, with_against = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"
ping, plugin_env = sys.argv[5], sys.argv[6:]
# perftest prints "inf" when a run's clock reading failed; such a figure is missing, not huge.
num = lambda v: None if v == "-" or not math.isfinite(float(v)) else float(v)
# The benchmark writes null for a figure it could not compute; the median skips those.
median = lambda vs: statistics.median(vs) if vs else None
# perftest's runs per size: (bw, msg/s, lat) of each run.
perf_runs = {}
for r in range(1, runs + 1):
    for line in open(f"{work}/perftest.{r}.txt"):
        size, bw, msgs, lat = line.split()
        perf_runs.setdefault(int(size), []).append((num(bw), num(msgs), num(lat)))
perf = {size: tuple(median([v for v in vs if v is not None]) for vs in zip(*rs))
        for size, rs in perf_runs.items()}
FIELDS = ["bw_mb_per_s", "msgs_per_s", "lat_us", "cpu_send_us_per_msg", "cpu_recv_us_per_msg"]

def load(name):
    sweeps = [json.load(open(f"{work}/{name}.{r}.json")) for r in range(1, runs + 1)]
    medians = {}
    for size in perf:
        rows = [next(x for x in s["results"] if x["size"] == size) for s in sweeps]
        medians[size] = {f: median([r[f] for r in rows if r[f] is not None]) for f in FIELDS}
        medians[size]["runs"] = {f: [r[f] for r in rows] for f in FIELDS}
    return {"name": sweeps[0]["name"], "plugin": sweeps[0]["plugin"], "device": sweeps[0]["device"],
            "abi": sweeps[0]["abi"], "inflight": sweeps[0]["inflight"], "medians": medians}

ours = load("plugin")
other = load("against") if with_against else None
ratio = lambda a, b: None if not a or not b else a / b
# Run i of this plugin over run i of perftest or of the other plugin (adjacent in time): their
# spread shows whether a ratio of the medians is resolved on this host or within its noise.
ratios_by_run = lambda ours_runs, theirs_runs: [ratio(x, y) for x, y in zip(ours_runs, theirs_runs)]
rows = []
for size, (pbw, pmsgs, plat) in sorted(perf.items()):
    o = ours["medians"][size]
    ib_runs = [{"bw_mb_per_s": b, "msgs_per_s": m, "lat_us": l} for b, m, l in perf_runs[size]]
    by_ib = lambda f: ratios_by_run(o["runs"][f], [r[f] for r in ib_runs])
    row = {"size": size, "ib_write_bw_mb_per_s": pbw, "ib_write_bw_msgs_per_s": pmsgs, "ib_write_lat_us": plat,
           "plugin": o, "bw_vs_ib_write_bw": ratio(o["bw_mb_per_s"], pbw),
           "msgs_vs_ib_write_bw": ratio(o["msgs_per_s"], pmsgs), "lat_vs_ib_write_lat": ratio(o["lat_us"], plat),
           "perftest_runs": ib_runs,
           "paired_vs_perftest": {"bw": by_ib("bw_mb_per_s"), "lat": by_ib("lat_us")}}
    if other:
        a = other["medians"][size]
        paired = lambda f: ratios_by_run(o["runs"][f], a["runs"][f])
        row.update({"against": a, "bw_vs_against": ratio(o["bw_mb_per_s"], a["bw_mb_per_s"]),
                    "lat_vs_against": ratio(o["lat_us"], a["lat_us"]),
                    "msgs_vs_against": ratio(o["msgs_per_s"], a["msgs_per_s"]),
                    "paired_vs_against": {"lat": paired("lat_us"), "msgs": paired("msgs_per_s")}})
    rows.append(row)
doc = {"device": ours["device"], "runs": runs, "ping": ping, "plugin_env": plugin_env,
       "plugin": {k: ours[k] for k in ("name", "plugin", "abi", "inflight")},
       "against": {k: other[k] for k in ("name", "plugin", "abi", "inflight")} if other else None, "results": rows}
if as_json:
    print(json.dumps(doc, allow_nan=False))
    sys.exit(0)
f = lambda v, spec: "-" if v is None else format(v, spec)
print(f"# {ours['name']} ({ours['plugin']}, ncclNet v{ours['abi']}) on {ours['device']}, {ours['inflight']} in flight, "
      f"medians of {runs} run(s)" + (f", with {' '.join(plugin_env)}" if plugin_env else "")
      + (f"; against {other['name']} ({other['plugin']}, v{other['abi']})" if other else "")
      + ("" if ping == "ahead" else f"; ping-pong with {ping} receives"))
# The table's columns: header, width, format, the value in a row, whether only with --against.
against = lambda key: lambda r: r["against"][key]
columns = [
    ("size(B)", 9, "d", lambda r: r["size"], False),
    ("ib_bw", 9, ".1f", lambda r: r["ib_write_bw_mb_per_s"], False),
    ("bw", 9, ".1f", lambda r: r["plugin"]["bw_mb_per_s"], False),
    ("/ib", 5, ".2f", lambda r: r["bw_vs_ib_write_bw"], False),
    ("bw.vs", 9, ".1f", against("bw_mb_per_s"), True),
    ("/vs", 5, ".2f", lambda r: r["bw_vs_against"], True),
    ("ib_lat", 8, ".2f", lambda r: r["ib_write_lat_us"], False),
    ("lat", 8, ".2f", lambda r: r["plugin"]["lat_us"], False),
    ("/ib", 5, ".2f", lambda r: r["lat_vs_ib_write_lat"], False),
    ("lat.vs", 8, ".2f", against("lat_us"), True),
    ("/vs", 5, ".2f", lambda r: r["lat_vs_against"], True),
    ("ib_msg/s", 8, ".0f", lambda r: r["ib_write_bw_msgs_per_s"], False),
    ("msg/s", 8, ".0f", lambda r: r["plugin"]["msgs_per_s"], False),
    ("/ib", 5, ".2f", lambda r: r["msgs_vs_ib_write_bw"], False),
    ("vs", 8, ".0f", against("msgs_per_s"), True),
    ("/vs", 5, ".2f", lambda r: r["msgs_vs_against"], True),
    ("cpu.s", 6, ".1f", lambda r: r["plugin"]["cpu_send_us_per_msg"], False),
    ("cpu.r", 6, ".1f", lambda r: r["plugin"]["cpu_recv_us_per_msg"], False),
    ("vs.s", 6, ".1f", against("cpu_send_us_per_msg"), True),
    ("vs.r", 6, ".1f", against("cpu_recv_us_per_msg"), True),
]
columns = [c for c in columns if other or not c[4]]
print(" ".join(f"{name:>{width}}" for name, width, *_ in columns))
print("# bw in MB/s (10^6 B), lat in us (ping-pong, half the round trip), msg/s in the bandwidth phase (ib_msg/s: ib_write_bw's, one write per message), cpu in us per message (bandwidth phase); /ib and /vs are ours over theirs")
for r in rows:
    print(" ".join(f"{f(value(r), spec):>{width}}" for _, width, spec, value, _ in columns))
if runs > 1:
    print("# paired runs (run i of ours over run i of perftest" + (" and of theirs" if other else "")
          + "): median [lowest-highest] of the ratios")
    print(f"{'size(B)':>9} {'bw/ib':>18} {'lat/ib':>18}" + (f" {'lat/vs':>18} {'msg/s /vs':>18}" if other else ""))
    def spread(vs):
        vs = [v for v in vs if v is not None]
        return f"{median(vs):.2f} [{min(vs):.2f}-{max(vs):.2f}]" if vs else "-"
    for r in rows:
        ib = r["paired_vs_perftest"]
        line = f"{r['size']:>9} {spread(ib['bw']):>18} {spread(ib['lat']):>18}"
        if other:
            p = r["paired_vs_against"]
            line += f" {spread(p['lat']):>18} {spread(p['msgs']):>18}"
        print(line)
PY
