#!/usr/bin/env bash
# Instructions per call of a plugin's data-path entry points (isend, irecv, test), counted by
# callgrind over a ping-pong of nccl-net-bench (8-byte messages, or --size BYTES): what each
# call costs in user space, independent of how fast the (emulated) CPU runs. Run it inside the
# Soft-RoCE VM, once per plugin, after `cargo build --release --bin nccl-net-bench` and
# `scripts/build-plugin.sh`:
#
#   scripts/rdma-vm.sh scripts/count-instructions.sh target/plugin/libnccl_net.so
#   scripts/rdma-vm.sh scripts/count-instructions.sh ../shared/reference-plugin/libnccl-net-mlnx.so \
#     --preload scripts/rxe-realpath.c
#
# Prints, per benchmark process (rank), each isend/irecv/test function of the plugin the
# benchmark called: instructions per call and per message (inclusive: the provider's
# user-space work included, a NULL request's retries counted), and the number of calls.
#
# With --locks, a second run counts the lock operations of the ping-pong (locked instructions:
# `lock`-prefixed ones and `xchg` with memory, i.e. atomic read-modify-writes, the plugin's
# mutexes and the provider's spinlocks) per message, by library, and times an uncontended
# lock/unlock pair of `lock cmpxchg` on this machine against plain increments.
#
# With --split, one more run per entry point splits each call's instructions by library: the
# plugin's own code, the provider's (librxe) and libc's, per call, so that two plugins' own
# work can be compared apart from the posts and polls they both make.
#
# With --lines NAME, the runs of --split also attribute the plugin's instructions inside each
# entry point whose name contains NAME (irecv, isend, test) to this repository's source lines
# (the innermost line of ours that each instruction was inlined from), per call: the busiest
# lines, then the total per source file. It needs a plugin built with line tables:
#   CARGO_PROFILE_PLUGIN_DEBUG=line-tables-only CARGO_TARGET_DIR=target/lines scripts/build-plugin.sh
#   scripts/rdma-vm.sh scripts/count-instructions.sh target/lines/plugin/libnccl_net.so --lines irecv
# Needs valgrind, gcc, objdump and addr2line (`scripts/deps.sh profile`).
set -euo pipefail

usage() {
  echo "usage: $0 PLUGIN.so [--preload SHIM.c] [--iters N] [--size BYTES] [--dev DEV] [--locks] [--split] [--lines NAME]" >&2
  exit 2
}
[ $# -ge 1 ] || usage
plugin=$(realpath "$1")
shift
preload="" iters=2000 size=8 dev=rxe0 locks=0 split=0 lines=
while [ $# -gt 0 ]; do
  case "$1" in
    --preload) preload=$2; shift 2 ;;
    --locks) locks=1; shift ;;
    --split) split=1; shift ;;
    --lines) lines=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --dev) dev=$2; shift 2 ;;
    *) usage ;;
  esac
done
for prog in valgrind python3 gcc objdump addr2line; do
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

# Callgrind over the benchmark's ping-pong, both ranks: `profile PATTERN [OPTION...]` writes
# the profiles to PATTERN (%p: the process), with any further valgrind options.
profile() {
  local pattern=$1
  shift
  LD_PRELOAD=$shim valgrind --tool=callgrind --trace-children=yes "$@" \
    --callgrind-out-file="$pattern" "$bench" --plugin "$plugin" --dev "$dev" \
    --min "$size" --max "$size" --iters 1 --lat-iters "$iters" >"$out/bench.log" 2>&1 ||
    {
      rc=$?
      echo "$0: the profiled benchmark failed (exit $rc, profile ${pattern##*/}); its output:" >&2
      cat "$out/bench.log" >&2
      df -h "$out" >&2
      exit 1
    }
}

profile "$out/callgrind.%p"

python3 - "$plugin" "$iters" "$out/names" "$out"/callgrind.* <<'EOF'
import os, re, sys
from collections import defaultdict

plugin, iters, names_out, files = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]

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

def rank(path):
    """The benchmark's rank in a profile: 1 for the child it starts with --role client."""
    for line in open(path):
        if line.startswith("cmd:"):
            return 1 if "--role client" in line else 0
    return 0

names = set()
for path in sorted(files):
    rows = sorted(calls_into_plugin(path), key=lambda r: r[0])
    print(f"# {os.path.basename(plugin)}, process {path.rsplit('.', 1)[1]} (rank {rank(path)}): "
          f"{iters} messages each way; per call, per message, calls")
    for name, calls, ir in rows:
        print(f"  {ir / calls:7.0f} {ir / iters:7.0f} {calls:7d}  {name}")
    names.update(name for name, _, _ in rows)
open(names_out, "w").write("\n".join(sorted(names)) + "\n")
EOF

if [ "$split" = 1 ] || [ -n "$lines" ]; then
  # One run per entry point (those the run above found), collecting only inside it; with
  # --lines, every instruction's address kept too.
  k=0
  while read -r name; do
    profile "$out/split.$k.%p" --collect-atstart=no --toggle-collect="$name" ${lines:+--dump-instr=yes}
    k=$((k + 1))
  done <"$out/names"
  python3 - "$out/names" "$plugin" "$root/" "$lines" "$out"/split.* <<'EOF'
import os, re, subprocess, sys
from collections import Counter

names = open(sys.argv[1]).read().split("\n")
plugin, root, lines, files = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]

def costs(path, name):
    """(rank, calls of `name`, instructions by library, the plugin's by address) of one run."""
    rank, calls, ids = 0, 0, {"ob": {}, "fn": {}}
    by_lib, by_addr = Counter(), Counter()
    ob = fn = callee = None
    positions, last, after_call = ["line"], [0], False
    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith("cmd:") and "--role client" in line:
            rank = 1
        if line.startswith("positions:"):
            positions = line.split()[1:]
            last = [0] * len(positions)
        m = re.match(r"(c?)(ob|fn)=\((\d+)\)(?: (.*))?$", line)
        if m:
            called, kind, ident, label = m.groups()
            if label:
                ids[kind][ident] = label
            value = ids[kind].get(ident)
            if kind == "ob" and not called:
                ob = value
            elif kind == "fn":
                callee, fn = (value, fn) if called else (None, value)
        elif line.startswith("calls="):
            # Calls into the entry point from outside it: this run's number of calls.
            if callee == name and fn != name:
                calls += int(line.split("=")[1].split()[0])
            after_call = True
        elif line[:1] in "0123456789+-*":
            f = line.split()
            for i, p in enumerate(f[:len(positions)]):
                if p != "*":
                    v = int(p[1:], 0) if p[0] in "+-" else int(p, 0)
                    last[i] = last[i] + v if p[0] == "+" else last[i] - v if p[0] == "-" else v
            if not after_call and len(f) > len(positions):
                n = int(f[len(positions)])
                by_lib[os.path.basename(ob or "")] += n
                if ob == plugin and positions[0] == "instr":
                    by_addr[last[0]] += n
            after_call = False
    return rank, calls, by_lib, by_addr

def our_lines(addresses):
    """Address -> the innermost file:line of this repository it was inlined from."""
    out = subprocess.run(["addr2line", "-a", "-i", "-e", plugin] + [hex(a) for a in addresses],
                         capture_output=True, text=True).stdout.splitlines()
    found, current = {}, None
    for line in out:
        if line.startswith("0x"):
            current = int(line, 16)
        elif current is not None and current not in found and line.startswith(root):
            found[current] = line[len(root):].split(" ")[0]
    return found

def print_lines(rank, name, calls, by_addr):
    """The plugin's instructions per call by source line (the busiest), then by file."""
    where = our_lines(sorted(by_addr))
    by_line, by_file = Counter(), Counter()
    for addr, n in by_addr.items():
        line = where.get(addr, "(no line of this repository)")
        by_line[line] += n
        by_file[line.rsplit(":", 1)[0]] += n
    print(f"# rank {rank}, {name}: {sum(by_addr.values()) / calls:.0f} instructions of the "
          f"plugin per call by source line (the busiest), then by file")
    for line, n in by_line.most_common(15) + [("", 0)] + by_file.most_common():
        print(f"  {n / calls:7.1f}  {line}" if line else "")

print("# per call, by library (each entry point's own instructions and its callees')")
attributed = []
for path in sorted(files):
    name = names[int(os.path.basename(path).split(".")[1])]
    rank, calls, by_lib, by_addr = costs(path, name)
    if not calls or not by_lib:
        continue
    libs = ", ".join(f"{lib} {n / calls:.0f}" for lib, n in by_lib.most_common())
    print(f"  rank {rank}, {name}: {sum(by_lib.values()) / calls:.0f} = {libs} ({calls} calls)")
    if lines and lines.lower() in name.lower():
        attributed.append((rank, name, calls, by_addr))
for rank, name, calls, by_addr in attributed:
    print_lines(rank, name, calls, by_addr)
EOF
fi

[ "$locks" = 1 ] || exit 0

# Only the ping-pong is collected (the benchmark's Endpoint::ping_pong, which holds no lock of
# its own), every instruction's address kept so that the locked ones can be picked out.
profile "$out/locks.%p" --dump-instr=yes --collect-atstart=no \
  --toggle-collect='*Endpoint::ping_pong*'

python3 - "$iters" "$out"/locks.* <<'EOF'
import os, re, subprocess, sys
from collections import Counter

iters, files = int(sys.argv[1]), sys.argv[2:]

def locked_addresses(obj):
    """Addresses (as callgrind gives them: offsets in a shared object) of obj's locked
    instructions."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", obj],
                          capture_output=True, text=True).stdout
    found = set()
    for line in text.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(\S.*)$", line)
        if m and (m.group(2).startswith("lock ") or
                  (m.group(2).startswith("xchg") and "(" in m.group(2))):
            found.add(int(m.group(1), 16))
    return found

def executed(path):
    """(object, address) -> times executed, from an instruction-level callgrind profile."""
    names, counts = {}, Counter()
    ob = fn_ob = None
    positions, last, after_call = [], [], False
    for line in open(path):
        line = line.rstrip("\n")
        m = re.match(r"(c?ob)=\((\d+)\)(?: (.*))?$", line)
        if m:
            if m.group(3):
                names[m.group(2)] = m.group(3)
            if m.group(1) == "ob":
                ob = names.get(m.group(2))
            continue
        if line.startswith("positions:"):
            positions = line.split()[1:]
            last = [0] * len(positions)
        elif line.startswith("fn="):
            fn_ob = ob
        elif line.startswith("calls="):
            after_call = True
        elif line[:1] in "0123456789+-*" and positions:
            fields = line.split()
            for i, f in enumerate(fields[:len(positions)]):
                if f == "*":
                    continue
                v = int(f[1:], 0) if f[0] in "+-" else int(f, 0)
                last[i] = last[i] + v if f[0] == "+" else last[i] - v if f[0] == "-" else v
            if not after_call and len(fields) > len(positions):
                counts[(fn_ob, last[0])] += int(fields[len(positions)])
            after_call = False
    return counts

locked = {}
for path in sorted(files):
    per_lib = Counter()
    for (obj, addr), n in executed(path).items():
        if obj not in locked:
            locked[obj] = locked_addresses(obj) if obj and os.path.exists(obj) else set()
        if addr in locked[obj]:
            per_lib[os.path.basename(obj)] += n
    total = sum(per_lib.values())
    libs = ", ".join(f"{lib} {n / iters:.1f}" for lib, n in per_lib.most_common())
    print(f"# process {path.rsplit('.', 1)[1]}: {total / iters:.1f} locked instructions per "
          f"message in the ping-pong ({libs or 'none'})")
EOF

cat >"$out/locks.c" <<'EOF'
#include <stdint.h>
#include <stdio.h>
#include <time.h>
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
static volatile uint8_t word;
static volatile uint64_t counter;
int main(void) {
  const long n = 2000000;
  double t0 = now();
  for (long i = 0; i < n; i++) {
    uint8_t e = 0;
    __atomic_compare_exchange_n(&word, &e, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
    e = 1;
    __atomic_compare_exchange_n(&word, &e, 0, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
  }
  double t1 = now();
  for (long i = 0; i < n; i++) {
    counter = counter + 1;
    counter = counter + 1;
  }
  double t2 = now();
  printf("# an uncontended lock/unlock pair (two lock cmpxchg) takes %.1f ns here; two plain "
         "increments of a memory word %.1f ns\n", (t1 - t0) / n * 1e9, (t2 - t1) / n * 1e9);
  return 0;
}
EOF
gcc -O2 -o "$out/locks" "$out/locks.c"
"$out/locks"
