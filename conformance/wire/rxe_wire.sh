#!/bin/bash
# The wire checks against the kernel's rxe (docs/wire.md). Runs in the rxe VM with rxe0 on
# veth0 (10.0.4.1); veth1 (10.0.4.2) goes into a network namespace standing in for another
# host, where the emulator's side runs from its test binary on an ordinary UDP socket.
#   accepts: the emulator's encoder sends a UD SEND; rxe must complete a receive with it
#   sends:   rxe sends a UD SEND; the emulator must check its ICRC and decode it as sent
# Exit 0 when the check holds.
#   cargo test --release -p rdma-emu --lib --no-run
#   cc -O1 -o target/rxe_ud conformance/wire/rxe_ud.c -libverbs
#   RXE_VM_NETDEVS=veth0 ../shared/rxe-vm/run.sh 'bash conformance/wire/rxe_wire.sh accepts'
#   RXE_VM_NETDEVS=veth0 ../shared/rxe-vm/run.sh 'bash conformance/wire/rxe_wire.sh sends'
set -eu
case "${1:-}" in
accepts) test_name=fabric::pcap::test::wire_peer_sends_one_ud_send ;;
sends) test_name=fabric::roce::test::wire_peer_receives_one_ud_send ;;
*) echo "usage: $0 accepts|sends"; exit 2 ;;
esac
test_bin=
for t in $(ls -t target/release/deps/rdma_emu-*); do
    [ -x "$t" ] && [ "${t%.d}" = "$t" ] || continue
    if "$t" --list 2>/dev/null | grep -q "${test_name##*::}"; then test_bin=$t; break; fi
done
[ -n "$test_bin" ] || { echo "no emulator test binary: cargo test --release -p rdma-emu --lib --no-run"; exit 2; }
ip netns add peer
ip link set veth1 netns peer
ip netns exec peer ip addr add 10.0.4.2/24 dev veth1
ip netns exec peer ip link set veth1 up
ip netns exec peer ip link set lo up
emulator() { ip netns exec peer env "$@" "$test_bin" --exact "$test_name" --nocapture 2>&1; }
status=0
if [ "$1" = accepts ]; then
    target/rxe_ud receive 10.0.4.1 > /tmp/received &
    rxe=$!
    for _ in $(seq 50); do grep -q '^qpn' /tmp/received && break; sleep 0.1; done
    qpn=$(sed -n 's/^qpn \([0-9]*\)/\1/p' /tmp/received)
    emulator RDMA_EMU_WIRE_PEER="10.0.4.2,10.0.4.1,$qpn" | grep '^sent'
    wait "$rxe" || status=$?
    cat /tmp/received
else
    emulator RDMA_EMU_WIRE_LISTEN=10.0.4.2 > /tmp/heard &
    listener=$!
    for _ in $(seq 50); do grep -q '^listening' /tmp/heard && break; sleep 0.1; done
    target/rxe_ud send 10.0.4.1 10.0.4.2
    wait "$listener" || status=$?
    grep -E '^received|panicked|test result' /tmp/heard
fi
exit "$status"
