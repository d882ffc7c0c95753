#!/bin/bash
# sockperf's UDP ping-pong, blocked in recvfrom, one way at the median (usec): over the kernel's
# loopback, then over the emulator's datagram rsockets through Debian's librspreload, alternated,
# five runs of 2 s each (after `cargo build --release --workspace`; needs Debian's sockperf and
# librdmacm1). Prints each run's pair and their ratio (emulated / kernel).
set -u
cd "$(dirname "$0")/.."
re=target/release/rdma-emu
preload=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so
export RDMA_EMU_LIB=$PWD/target/release/libibverbs.so
median() { awk '/percentile 50.000/ { print $NF }'; }
for i in 1 2 3 4 5; do
    port=$((7700 + i))
    timeout 6 sockperf sr -i 127.0.0.1 -p $port > /dev/null 2>&1 &
    sleep 0.5
    kernel=$(timeout 20 sockperf pp -i 127.0.0.1 -p $port -t 2 2>&1 | median)
    wait
    port=$((7710 + i))
    $re run --fabric "sockperf-$$-$i" -- env LD_PRELOAD=$preload \
        timeout 8 sockperf sr -i 127.0.0.1 -p $port > /dev/null 2>&1 &
    sleep 1.5
    emulated=$($re run --fabric "sockperf-$$-$i" -- env LD_PRELOAD=$preload \
        sockperf pp -i 127.0.0.1 -p $port -t 2 2>&1 | median)
    wait
    awk -v i="$i" -v k="$kernel" -v e="$emulated" \
        'BEGIN { printf "run %d: kernel %s us, emulated %s us, ratio %.3fx\n", i, k, e, e / k }'
done
