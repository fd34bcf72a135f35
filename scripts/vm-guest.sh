#!/bin/bash
# Runs inside the VM started by rdma-vm.sh: brings up the two Soft-RoCE devices, then runs
# WORKDIR/cmd.sh and records its exit code in WORKDIR/rc.
#
# usage: vm-guest.sh WORKDIR
work="$1"

setup_rxe() {
  modprobe rdma_rxe &&
    ip link set lo up &&
    rdma link add rxe0 type rxe netdev lo &&
    ip link add dummy0 type dummy &&
    sysctl -qw net.ipv4.conf.all.route_localnet=1 &&
    ip addr add 127.0.1.1/32 dev dummy0 &&
    ip link set dummy0 up &&
    sysctl -qw net.ipv4.conf.dummy0.route_localnet=1 &&
    rdma link add rxe1 type rxe netdev dummy0 &&
    [ -e /sys/class/infiniband/rxe0 ] && [ -e /sys/class/infiniband/rxe1 ]
}

if ! setup_rxe; then
  echo "rdma-vm: Soft-RoCE setup failed (rdma_rxe, rxe0 on lo, rxe1 on dummy0)" >&2
  echo 125 >"$work/rc"
  exit 125
fi
echo "rdma-vm: Soft-RoCE ready: rxe0 on lo, rxe1 on dummy0 (127.0.1.1)"

bash "$work/cmd.sh"
rc=$?
echo "$rc" >"$work/rc"
exit "$rc"
