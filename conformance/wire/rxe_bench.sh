#!/bin/bash
# ib_write_bw (1 MiB) and ib_send_lat (8 bytes) in the rxe VM: rxe to rxe (two processes on
# rxe0), then the emulator (a network namespace, wire port 10.0.4.2) to rxe0 (10.0.4.1); each
# line is the client's average (MB/s, or us). docs/benchmarks.md has the figures.
#   cargo build --release --workspace
#   RXE_VM_NETDEVS=veth0 ../shared/rxe-vm/run.sh 'bash conformance/wire/rxe_bench.sh'
set -u
E=$PWD/target/release/rdma-emu
ip netns add peer; ip link set veth1 netns peer; ip link set veth0 mtu 9000
ip netns exec peer ip addr add 10.0.4.2/24 dev veth1
ip netns exec peer ip link set veth1 mtu 9000 up; ip netns exec peer ip link set lo up
col() { awk -v c="$1" '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ { v = $c } END { print v }'; }
for p in "ib_write_bw 4 -s 1048576 -n 200" "ib_send_lat 6 -s 8 -n 2000"; do
  set -- $p; prog=$1; c=$2; shift 2
  $prog -d rxe0 -x 1 -F -p 19000 "$@" > /dev/null 2>&1 & sleep 1
  echo "rxe-rxe $prog $($prog -d rxe0 -x 1 -F -p 19000 "$@" 127.0.0.1 2>/dev/null | col $c)"; wait
  $prog -d rxe0 -x 1 -F -p 19001 "$@" > /dev/null 2>&1 & sleep 1
  echo "emu-rxe $prog $(ip netns exec peer $E run --profile rxe --fabric none --mtu 9000 --wire 10.0.4.2 -- $prog -d emu0 -x 2 -F -p 19001 "$@" 10.0.4.1 2>/dev/null | col $c)"; wait
done
