#!/bin/bash
# Runs inside the VM started by rdma-vm.sh: brings up the Soft-RoCE devices, then runs
# WORKDIR/cmd.sh and records its exit code in WORKDIR/rc.
#
#   rxe0  on lo     127.0.0.1  traffic to itself only (rxe's own loopback)
#   rxe1  on veth0  127.0.1.1  \ a veth pair: policy routing sends packets for one end's address
#   rxe2  on veth1  127.0.1.2  / out of the other end, so rxe1 and rxe2 reach each other
#
# Without the veth trick every packet to a local address enters on `lo`, where rxe0 would take
# it; with it, cross-device traffic (a fused rxe1+rxe2 against a lone rxe1) works in one VM.
#
# usage: vm-guest.sh WORKDIR
#        vm-guest.sh --restore-veth   (inside the VM: both veth ends up, routes back)
work="$1"

sysctl_all() {
  local dev
  for dev in all default lo veth0 veth1; do
    sysctl -qw "net.ipv4.conf.$dev.$1=$2" || return 1
  done
}

# Routes and neighbours of the veth pair; the kernel drops them when an end goes down, so tests
# that take a link down call `vm-guest.sh --restore-veth` afterwards.
veth_routes() {
  ip route replace 127.0.1.2/32 dev veth0 src 127.0.1.1 table 100 &&
    ip route replace 127.0.1.1/32 dev veth1 src 127.0.1.2 table 100 &&
    ip neigh replace 127.0.1.2 lladdr "$(cat /sys/class/net/veth1/address)" dev veth0 nud permanent &&
    ip neigh replace 127.0.1.1 lladdr "$(cat /sys/class/net/veth0/address)" dev veth1 nud permanent
}

setup_veth_pair() {
  ip link add veth0 type veth peer name veth1 &&
    ip addr add 127.0.1.1/32 dev veth0 &&
    ip addr add 127.0.1.2/32 dev veth1 &&
    ip link set veth0 up && ip link set veth1 up &&
    sysctl_all route_localnet 1 && sysctl_all accept_local 1 && sysctl_all rp_filter 0 &&
    # Local delivery only for packets that came in on a veth end (or are not for a veth address).
    ip rule add pref 100 lookup local && ip rule del pref 0 &&
    ip rule add pref 10 iif veth0 lookup local &&
    ip rule add pref 11 iif veth1 lookup local &&
    ip rule add pref 20 to 127.0.1.2 lookup 100 &&
    ip rule add pref 21 to 127.0.1.1 lookup 100 &&
    veth_routes
}

if [ "$work" = --restore-veth ]; then
  ip link set veth0 up && ip link set veth1 up && veth_routes
  exit
fi

setup_rxe() {
  modprobe rdma_rxe &&
    ip link set lo up &&
    rdma link add rxe0 type rxe netdev lo &&
    setup_veth_pair &&
    rdma link add rxe1 type rxe netdev veth0 &&
    rdma link add rxe2 type rxe netdev veth1 &&
    [ -e /sys/class/infiniband/rxe0 ] && [ -e /sys/class/infiniband/rxe1 ] &&
    [ -e /sys/class/infiniband/rxe2 ]
}

if ! setup_rxe; then
  echo "rdma-vm: Soft-RoCE setup failed (rdma_rxe; rxe0 on lo, rxe1/rxe2 on veth0/veth1)" >&2
  echo 125 >"$work/rc"
  exit 125
fi
echo "rdma-vm: Soft-RoCE ready: rxe0 on lo, rxe1 on veth0 (127.0.1.1), rxe2 on veth1 (127.0.1.2)"

bash "$work/cmd.sh"
rc=$?
echo "$rc" >"$work/rc"
exit "$rc"
