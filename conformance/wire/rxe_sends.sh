#!/bin/bash
# Runs in the rxe VM with rxe0 on veth0 (docs/wire.md): from a network namespace holding veth1
# (10.0.4.2, standing in for another host), an ordinary UDP socket of the emulator's test
# listens on port 4791; rxe0 (10.0.4.1) sends it a UD SEND. The datagram must check (ICRC) and
# decode as sent. Exit 0 on success.
#   cargo test --release -p rdma-emu --lib --no-run
#   cc -O1 -o target/rxe_send conformance/wire/rxe_send.c -libverbs
#   RXE_VM_NETDEVS=veth0 ../shared/rxe-vm/run.sh 'bash conformance/wire/rxe_sends.sh'
set -eu
test_bin=
for t in $(ls -t target/release/deps/rdma_emu-*); do
    [ -x "$t" ] && [ "${t%.d}" = "$t" ] || continue
    if "$t" --list 2>/dev/null | grep -q wire_peer_receives_one_ud_send; then test_bin=$t; break; fi
done
[ -n "$test_bin" ] || { echo "no emulator test binary: cargo test --release -p rdma-emu --lib --no-run"; exit 2; }
ip netns add peer
ip link set veth1 netns peer
ip netns exec peer ip addr add 10.0.4.2/24 dev veth1
ip netns exec peer ip link set veth1 up
ip netns exec peer ip link set lo up
ip netns exec peer env RDMA_EMU_WIRE_LISTEN=10.0.4.2 "$test_bin" \
    --exact fabric::roce::test::wire_peer_receives_one_ud_send --nocapture > /tmp/heard 2>&1 &
listener=$!
for _ in $(seq 50); do grep -q '^listening' /tmp/heard && break; sleep 0.1; done
target/rxe_send 10.0.4.1 10.0.4.2
status=0
wait "$listener" || status=$?
grep -E '^received|panicked|test result' /tmp/heard
exit "$status"
