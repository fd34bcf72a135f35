#!/usr/bin/env bash
# The project's test command (.ci/run calls exactly this):
#   1. installs what it needs (scripts/deps.sh, idempotent),
#   2. checks formatting and lints (cargo fmt, cargo clippy -D warnings),
#   3. runs `cargo test` on the host, then the GPU tests (which say "skipped: no GPU" without one),
#   4. checks scripts/install.sh and the installed files, then builds the Debian packages
#      (scripts/package.sh), installs them with dpkg, checks what NCCL and the doctor see (the
#      default name only from nccl-net-rsib-default), removes them,
#   5. runs the RDMA suites inside the Soft-RoCE VM (scripts/rdma-vm.sh); they fail without it.
# The last line is the summary over every suite: "summary: N passed, M failed, K skipped", where
# skipped counts the GPU tests that printed "<name>: skipped: <why>" (they pass in libtest's eyes).
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
command -v cargo >/dev/null || . "$HOME/.cargo/env"
logs="$repo/target/test-logs"
mkdir -p "$logs"
rm -f "$logs"/*.log
failed_steps=()

step() { # step NAME CMD...: run, tee into target/test-logs/NAME.log, remember failure
  local name="$1"
  shift
  echo "==> $name: $*"
  if ! "$@" 2>&1 | tee "$logs/$name.log"; then
    failed_steps+=("$name")
    echo "==> $name FAILED"
  fi
}

# VM-only suites ([[test]] ... test = false in Cargo.toml), run in this order: the doctor's
# before the benchmark and conformance suites, whose faults change the VM's links and addresses
# (its healthy-node sample is compared line for line with docs/doctor.md).
rdma_suites=(rdma_devices rdma_doctor rdma_bench rdma_conformance)

check_install() {
  local prefix="$repo/target/install-check"
  rm -rf "$prefix"
  scripts/install.sh "$prefix" &&
    [ -f "$prefix/lib/libnccl-net-rsib.so" ] && [ ! -L "$prefix/lib/libnccl-net-rsib.so" ] &&
    [ -f "$prefix/lib/libnccl-net.so" ] && [ ! -L "$prefix/lib/libnccl-net.so" ] &&
    for v in 8 9 10 11 12; do
      nm -D --defined-only "$prefix/lib/libnccl-net-rsib.so" | grep -q " ncclNetPlugin_v$v\$" || return 1
    done &&
    "$prefix/bin/nccl-net-doctor" --list-checks | grep -q '^verbs.provider' &&
    ldconfig_caches_both "$prefix" &&
    echo "install check: both libraries present, real files, exporting ncclNetPlugin_v8 .. v12," \
      "each in an ldconfig cache under its own name; nccl-net-doctor runs"
}

# The container recipe runs ldconfig on the install's lib directory and NCCL dlopens the plugin by
# name (NCCL_NET_PLUGIN=rsib, or the default libnccl-net.so): both names must be in the cache.
# Built here into a private cache, so no root is needed.
ldconfig_caches_both() {
  local ldconfig cache="$1/ld.so.cache" listing
  ldconfig="$(command -v ldconfig || echo /sbin/ldconfig)"
  echo "$1/lib" >"$1/ld.so.conf"
  "$ldconfig" -X -f "$1/ld.so.conf" -C "$cache" && listing="$("$ldconfig" -p -C "$cache")" || return 1
  for name in libnccl-net.so libnccl-net-rsib.so; do
    grep -q "^[[:space:]]*$name (" <<<"$listing" ||
      { echo "ldconfig does not cache $name (a soname other than the file name?)"; return 1; }
  done
}

# The Debian packages, installed for real. nccl-net-rsib alone must change nothing for a job that
# does not ask: the loader finds libnccl-net-rsib.so (the doctor on PATH sees NCCL open it for
# NCCL_NET_PLUGIN=rsib) and no libnccl-net.so of ours; nccl-net-rsib-default adds libnccl-net.so
# (NCCL's default name). Dependencies come from dpkg-shlibdeps. Removed afterwards, pass or fail.
check_package() {
  local debs rc=0
  mapfile -t debs < <(scripts/package.sh) && [ "${#debs[@]}" -eq 2 ] || return 1
  dpkg -r nccl-net-rsib-default nccl-net-rsib >/dev/null 2>&1 # left over from an interrupted run
  dpkg-deb -f "${debs[0]}" Depends | grep -q 'libc6 (>= 2\.[0-9]*).*libibverbs1 (>= [0-9]' ||
    { echo "the package's Depends are not dpkg-shlibdeps': $(dpkg-deb -f "${debs[0]}" Depends)"; return 1; }
  dpkg -i "${debs[0]}" || return 1
  package_serves_nccl libnccl-net-rsib.so rsib && package_leaves_the_default_alone || rc=1
  if dpkg -i "${debs[1]}"; then
    package_serves_nccl libnccl-net.so "" || rc=1
    dpkg -r nccl-net-rsib-default || rc=1
    package_leaves_the_default_alone || rc=1
  else
    rc=1
  fi
  dpkg -r nccl-net-rsib || rc=1
  package_is_gone || rc=1
  [ "$rc" -eq 0 ] && echo "package check: $(basename "${debs[0]}") installed with dpkg -i: the loader" \
    "found libnccl-net-rsib.so, nccl-net-doctor saw NCCL open RsIB for NCCL_NET_PLUGIN=rsib, and" \
    "libnccl-net.so came only with $(basename "${debs[1]}"); Depends from dpkg-shlibdeps; removed cleanly"
  return "$rc"
}

# package_serves_nccl NAME PLUGIN: the loader's cache has NAME from the package, and the doctor on
# PATH sees NCCL open it with NCCL_NET_PLUGIN=PLUGIN (unset when empty).
package_serves_nccl() {
  local name="$1" plugin="$2" cache doctor line
  cache="$(/sbin/ldconfig -p)"
  grep -q "^[[:space:]]*$name (.*/nccl-net-rsib/\(default/\)\?$name\$" <<<"$cache" ||
    { echo "the loader's cache has no $name from the package"; return 1; }
  doctor="$(command -v nccl-net-doctor)"
  [ "$doctor" = /usr/bin/nccl-net-doctor ] || { echo "nccl-net-doctor on PATH is '$doctor'"; return 1; }
  line="$(env -u LD_LIBRARY_PATH -u NCCL_NET_PLUGIN HOME=/nonexistent ${plugin:+NCCL_NET_PLUGIN=$plugin} \
    nccl-net-doctor --color never | grep -E '^[A-Z]+ +plugin\.load ')"
  echo "$line"
  grep -q "^PASS .*NCCL opens $name = /usr/lib/.*/nccl-net-rsib/.*$name (RsIB, ncclNet v12" \
    <<<"$line" || { echo "plugin.load does not pass for the package's $name"; return 1; }
}

# Without nccl-net-rsib-default, no libnccl-net.so of ours: a job that sets no NCCL_NET_PLUGIN
# does not load this plugin.
package_leaves_the_default_alone() {
  ! /sbin/ldconfig -p | grep -q 'libnccl-net.so (.*nccl-net-rsib/' ||
    { echo "libnccl-net.so of nccl-net-rsib is in the loader's cache without nccl-net-rsib-default"; return 1; }
}

package_is_gone() {
  ! /sbin/ldconfig -p | grep -q 'nccl-net-rsib/' && [ ! -e /usr/bin/nccl-net-doctor ] &&
    [ ! -e /etc/ld.so.conf.d/nccl-net-rsib.conf ] && [ ! -e /etc/ld.so.conf.d/nccl-net-rsib-default.conf ] ||
    { echo "dpkg -r left files or cache entries of nccl-net-rsib behind"; return 1; }
}

build_rdma_suites() {
  local args=()
  for s in "${rdma_suites[@]}"; do args+=(--test "$s"); done
  local built
  built="$(cargo test --no-run "${args[@]}" --message-format=json-render-diagnostics |
    grep -o '"executable":"[^"]*"' | cut -d'"' -f4)" || return 1
  for s in "${rdma_suites[@]}"; do
    grep -E "/deps/$s-[0-9a-f]+$" <<<"$built" || { echo "no test binary for $s"; return 1; }
  done >"$logs/rdma-binaries.txt" && cat "$logs/rdma-binaries.txt"
}

step deps scripts/deps.sh build vm
step fmt cargo fmt --check
# --all-targets leaves out `test = false` targets: name the VM and GPU suites so they are linted too.
step clippy cargo clippy --all-targets "${rdma_suites[@]/#/--test=}" --test=gpu --locked -- -D warnings
step doc env RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --lib --locked
step host-tests cargo test --locked
step gpu-tests cargo test --locked --test gpu -- --nocapture --test-threads=1
step install check_install
step package check_package
step rdma-build build_rdma_suites
if [ -s "$logs/rdma-binaries.txt" ]; then
  mapfile -t rdma_binaries <"$logs/rdma-binaries.txt"
  # The suites take 25-45 minutes on two loaded cores; the VM's own default (40) is too tight.
  step rdma-vm-tests env NCCL_NET_RS_VM_TIMEOUT="${NCCL_NET_RS_VM_TIMEOUT:-3600}" \
    scripts/rdma-vm.sh scripts/vm-tests.sh "${rdma_binaries[@]}"
else
  failed_steps+=(rdma-vm-tests)
fi

passed=0 failed=0
while read -r p f; do
  passed=$((passed + p)) failed=$((failed + f))
done < <(cat "$logs"/host-tests.log "$logs"/gpu-tests.log "$logs"/rdma-vm-tests.log 2>/dev/null |
  sed -n 's/.*test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\1 \2/p')
# With --nocapture libtest prints "test NAME ... " and the test's own line on one line.
skip_lines="$(cat "$logs"/*.log 2>/dev/null | grep -oE '[a-z0-9_]+: skipped: .*')"
skipped="$(printf '%s' "$skip_lines" | grep -c .)"
passed=$((passed - skipped))
echo
[ -n "$skip_lines" ] && printf '%s\n' "$skip_lines" | sed 's/^/skipped test: /'
for s in "${failed_steps[@]}"; do echo "failed step: $s (see target/test-logs/$s.log)"; done
failed=$((failed + ${#failed_steps[@]}))
echo "summary: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
