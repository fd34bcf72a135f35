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
# A second, independent path exists only while a test that needs two member paths made it
# (every other test, and the doctor's documented sample, see three devices):
#   rxe3  on veth2  127.0.2.1  \ the same trick on a second veth pair: a fused rxe1+rxe3
#   rxe4  on veth3  127.0.2.2  / against rxe2+rxe4 has two member paths that fail alone
#
# usage: vm-guest.sh WORKDIR
#        vm-guest.sh --restore-veth        (inside the VM: every veth end up, routes back)
#        vm-guest.sh --veth-restore-batch  (the `ip -batch` lines that --restore-veth runs)
#        vm-guest.sh --second-path up|down (inside the VM: make or remove veth2/veth3, rxe3/rxe4)
#        vm-guest.sh --extra-ports up|down (inside the VM: make or remove rxe5..rxe9 on dummy
#                    netdevs dum5..dum9, so that a fused device can have up to 8 members)
work="$1"

# The veth pairs: "END_A END_B ADDRESS_A ADDRESS_B RULE_PREF"; rules RULE_PREF and +1 deliver
# what came in on an end, +10 and +11 route to the other end's address.
PAIRS=("veth0 veth1 127.0.1.1 127.0.1.2 10" "veth2 veth3 127.0.2.1 127.0.2.2 12")

sysctl_on() { # sysctl_on NAME VALUE DEV...
  local name="$1" value="$2" dev
  shift 2
  for dev in "$@"; do
    sysctl -qw "net.ipv4.conf.$dev.$name=$value" || return 1
  done
}

# Routes and neighbours of one veth pair; the kernel drops them when an end goes down, so tests
# that take a link down call `vm-guest.sh --restore-veth` afterwards.
# Printed as `ip -batch` lines.
veth_routes() { # veth_routes END_A END_B ADDRESS_A ADDRESS_B
  echo "route replace $4/32 dev $1 src $3 table 100"
  echo "route replace $3/32 dev $2 src $4 table 100"
  echo "neigh replace $4 lladdr $(cat "/sys/class/net/$2/address") dev $1 nud permanent"
  echo "neigh replace $3 lladdr $(cat "/sys/class/net/$1/address") dev $2 nud permanent"
}

setup_veth_pair() { # setup_veth_pair END_A END_B ADDRESS_A ADDRESS_B RULE_PREF
  local pref="$5" key
  ip link add "$1" type veth peer name "$2" &&
    ip addr add "$3/32" dev "$1" &&
    ip addr add "$4/32" dev "$2" &&
    ip link set "$1" up && ip link set "$2" up &&
    for key in route_localnet accept_local; do sysctl_on "$key" 1 "$1" "$2" || return 1; done &&
    sysctl_on rp_filter 0 "$1" "$2" &&
    # Local delivery only for packets that came in on a veth end (or are not for a veth address).
    ip rule add pref "$pref" iif "$1" lookup local &&
    ip rule add pref $((pref + 1)) iif "$2" lookup local &&
    ip rule add pref $((pref + 10)) to "$4" lookup 100 &&
    ip rule add pref $((pref + 11)) to "$3" lookup 100 &&
    veth_routes "$1" "$2" "$3" "$4" | ip -batch -
}

remove_veth_pair() { # remove_veth_pair END_A END_B ADDRESS_A ADDRESS_B RULE_PREF
  local offset
  ip link del "$1" || return 1
  for offset in 0 1 10 11; do ip rule del pref $(($5 + offset)) || return 1; done
}

# One `ip -batch`: the links come up with their routes and neighbours in the same few
# milliseconds, as a network's ARP would find the peer at once (separate commands left a
# window of hundreds of ms in the VM in which a QP connected over a link that was up but had
# no route yet). Tests that time an outage read the lines ahead and run only `ip -batch`
# when it ends: each process this script starts costs up to hundreds of ms in a loaded VM.
veth_restore_batch() {
  local pair a b ia ib
  for pair in "${PAIRS[@]}"; do
    read -r a b ia ib _ <<<"$pair"
    [ -e "/sys/class/net/$a" ] || continue
    echo "link set $a up"
    echo "link set $b up"
    veth_routes "$a" "$b" "$ia" "$ib"
  done
}

case "$work" in
  --restore-veth)
    batch=$(veth_restore_batch) && ip -batch - <<<"$batch"
    exit
    ;;
  --veth-restore-batch)
    veth_restore_batch
    exit
    ;;
esac

if [ "$work" = --second-path ]; then
  case "$2" in
    up)
      # (the pair's fields, split on purpose)
      setup_veth_pair ${PAIRS[1]} &&
        rdma link add rxe3 type rxe netdev veth2 && rdma link add rxe4 type rxe netdev veth3 &&
        [ -e /sys/class/infiniband/rxe3 ] && [ -e /sys/class/infiniband/rxe4 ]
      ;;
    down)
      rdma link delete rxe3 && rdma link delete rxe4 &&
        remove_veth_pair ${PAIRS[1]}
      ;;
    *)
      echo "usage: vm-guest.sh --second-path up|down" >&2
      exit 2
      ;;
  esac
  exit
fi

if [ "$work" = --extra-ports ]; then
  for n in 5 6 7 8 9; do
    case "$2" in
      up) ip link add "dum$n" type dummy && ip link set "dum$n" up &&
        rdma link add "rxe$n" type rxe netdev "dum$n" && [ -e "/sys/class/infiniband/rxe$n" ] ;;
      down) rdma link delete "rxe$n" && ip link delete "dum$n" ;;
      *) echo "usage: vm-guest.sh --extra-ports up|down" >&2; exit 2 ;;
    esac || exit 1
  done
  exit
fi

setup_rxe() {
  modprobe rdma_rxe &&
    ip link set lo up &&
    rdma link add rxe0 type rxe netdev lo &&
    sysctl_on route_localnet 1 all default lo && sysctl_on accept_local 1 all default lo &&
    sysctl_on rp_filter 0 all default lo &&
    ip rule add pref 100 lookup local && ip rule del pref 0 &&
    # (the pair's fields, split on purpose)
    setup_veth_pair ${PAIRS[0]} &&
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
