#!/bin/bash
# Runs in the rxe VM with rxe0 on veth0 (docs/wire.md): a UD QP on rxe0 (10.0.4.1) waits for a
# datagram; from a network namespace holding veth1 (10.0.4.2, standing in for another host),
# the emulator's encoder builds a UD SEND and sends it from an ordinary UDP socket. rxe must
# complete the receive with the bytes. Prints the receive's completion; exit 0 on success.
#   cargo test --release -p rdma-emu --lib --no-run
#   cc -O1 -o target/rxe_receive conformance/wire/rxe_receive.c -libverbs
#   RXE_VM_NETDEVS=veth0 ../shared/rxe-vm/run.sh 'bash conformance/wire/rxe_accepts.sh'
set -eu
test_bin=
for t in $(ls -t target/release/deps/rdma_emu-*); do
    [ -x "$t" ] && [ "${t%.d}" = "$t" ] || continue
    if "$t" --list 2>/dev/null | grep -q wire_peer_sends_one_ud_send; then test_bin=$t; break; fi
done
[ -n "$test_bin" ] || { echo "no emulator test binary: cargo test --release -p rdma-emu --lib --no-run"; exit 2; }
ip netns add peer
ip link set veth1 netns peer
ip netns exec peer ip addr add 10.0.4.2/24 dev veth1
ip netns exec peer ip link set veth1 up
ip netns exec peer ip link set lo up
target/rxe_receive 10.0.4.1 > /tmp/received &
receiver=$!
for _ in $(seq 50); do grep -q '^qpn' /tmp/received && break; sleep 0.1; done
qpn=$(sed -n 's/^qpn \([0-9]*\).*/\1/p' /tmp/received)
ip netns exec peer env RDMA_EMU_WIRE_PEER="10.0.4.2,10.0.4.1,$qpn" "$test_bin" \
    --exact fabric::pcap::test::wire_peer_sends_one_ud_send --nocapture 2>&1 | grep '^sent'
status=0
wait "$receiver" || status=$?
cat /tmp/received
exit "$status"
