#!/usr/bin/env bash
# Runs inside the VM (see rdma-vm.sh): each given test binary in turn; fails if any fails.
#
# usage: scripts/vm-tests.sh TEST_BINARY...
rc=0
for exe in "$@"; do
  echo "rdma suite: $(basename "$exe") on $(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ')"
  "$exe" || rc=1
done
exit "$rc"
