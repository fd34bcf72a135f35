#!/usr/bin/env bash
# Instructions per call of a plugin's data-path entry points (isend, irecv, test), counted by
# callgrind over an 8-byte ping-pong of nccl-net-bench: what each call costs in user space,
# independent of how fast the (emulated) CPU runs. Run it inside the Soft-RoCE VM, once per
# plugin, after `cargo build --release --lib --bin nccl-net-bench`:
#
#   scripts/rdma-vm.sh scripts/count-instructions.sh target/release/libnccl_net.so
#   scripts/rdma-vm.sh scripts/count-instructions.sh ../shared/reference-plugin/libnccl-net-mlnx.so \
#     --preload ../shared/reference-plugin/realpath_rxe.c
#
# Prints, per benchmark process (rank), each isend/irecv/test function of the plugin the
# benchmark called: instructions per call and per message (inclusive: the provider's
# user-space work included, a NULL request's retries counted), and the number of calls.
# Needs valgrind (`scripts/deps.sh profile`).
set -euo pipefail

usage() {
  echo "usage: $0 PLUGIN.so [--preload SHIM.c] [--iters N] [--dev DEV]" >&2
  exit 2
}
[ $# -ge 1 ] || usage
plugin=$(realpath "$1")
shift
preload="" iters=2000 dev=rxe0
while [ $# -gt 0 ]; do
  case "$1" in
    --preload) preload=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --dev) dev=$2; shift 2 ;;
    *) usage ;;
  esac
done
for prog in valgrind python3; do
  command -v "$prog" >/dev/null || { echo "$0: $prog missing (scripts/deps.sh profile)" >&2; exit 1; }
done

root=$(cd "$(dirname "$0")/.." && pwd)
bench="$root/target/release/nccl-net-bench"
[ -x "$bench" ] || { echo "$0: $bench missing (cargo build --release --bin nccl-net-bench)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
shim=""
if [ -n "$preload" ]; then
  gcc -shared -fPIC -O2 -o "$out/preload.so" "$preload" -ldl
  shim="$out/preload.so"
fi

LD_PRELOAD=$shim valgrind --tool=callgrind --trace-children=yes \
  --callgrind-out-file="$out/callgrind.%p" "$bench" --plugin "$plugin" --dev "$dev" \
  --min 8 --max 8 --iters 1 --lat-iters "$iters" >"$out/bench.log" 2>&1 ||
  { cat "$out/bench.log" >&2; exit 1; }

python3 - "$plugin" "$iters" "$out"/callgrind.* <<'EOF'
import os, re, sys
from collections import defaultdict

plugin, iters, files = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

def calls_into_plugin(path):
    """(callee, calls, inclusive Ir) for calls from the benchmark into the plugin."""
    names = {"ob": {}, "fn": {}}
    ob = fn = call_ob = call_fn = None
    pending = None
    edges = defaultdict(lambda: [0, 0])
    for line in open(path):
        m = re.match(r"(c?)(ob|fn)=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
        if m:
            called, kind, ident, name = m.groups()
            if name:
                names[kind][ident] = name
            value = names[kind].get(ident)
            if kind == "ob":
                call_ob, ob = (value, ob) if called else (call_ob, value)
            else:
                call_fn, fn = (value, fn) if called else (call_fn, value)
            continue
        if line.startswith("calls="):
            pending = int(line.split("=")[1].split()[0])
            continue
        if pending is not None and line[:1] in "0123456789+-*":
            callee_ob = call_ob or ob
            if os.path.basename(ob or "") == "nccl-net-bench" and callee_ob == plugin:
                edges[call_fn][0] += pending
                edges[call_fn][1] += int(line.split()[1])
            pending, call_ob = None, None
    data_path = re.compile(r"isend|irecv|test", re.IGNORECASE)
    return [(f, c, ir) for f, (c, ir) in edges.items() if data_path.search(f or "")]

for path in sorted(files):
    rows = sorted(calls_into_plugin(path), key=lambda r: r[0])
    print(f"# {os.path.basename(plugin)}, process {path.rsplit('.', 1)[1]}: "
          f"{iters} messages each way; per call, per message, calls")
    for name, calls, ir in rows:
        print(f"  {ir / calls:7.0f} {ir / iters:7.0f} {calls:7d}  {name}")
EOF
