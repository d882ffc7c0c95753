#!/usr/bin/env bash
# One entry point for CI and humans: ./ci.sh test | lint | bench | sanitize | asan_fuzz | tsan
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TERM_COLOR=never

# System packages the tests need: readelf (binutils) for the export-table test, the verbs and
# rdma_cm headers and link library for the C tests and layout checks, Debian's ibverbs-utils,
# rdmacm-utils and perftest to run unmodified, as server and client processes, infiniband-diags
# (ibstat, ibstatus), netcat-openbsd, socat, iperf3, iperf, curl, wget and sockperf to run over
# rsockets (librspreload), tshark to decode the packet traces, and ucx-utils (UCX's ucx_info and
# ucx_perftest), qperf, Open MPI (openmpi-bin, and libopenmpi-dev for mpicc), MPICH (mpich,
# libmpich-dev), fio and libfabric-bin to run real RDMA stacks over the emulator, python3-pyverbs
# for rdma-core's own tests (it ships them), valgrind to run a pingpong pair under memcheck,
# iproute2 to make the network namespaces that stand in for two hosts joined by wire ports, gdb,
# whose backtraces of a test's process that hangs go into the test's failure, qemu-system-x86 to
# live-migrate a guest over RDMA, and tgt (an iSCSI target with iSER) with qemu-utils and
# qemu-block-extra (QEMU's tools, and its libiscsi driver) to serve and use a disk over iSER,
# dapl2-utils (DAPL's dtest, dtestx, dapltest), hpcc (the HPC Challenge benchmarks, an Open MPI
# program that checks its own results), netpipe-openmpi (NetPIPE, whose integrity mode checks every
# message's bytes), ceph-mon and ceph-osd (a Ceph cluster over its RDMA messenger),
# librpma-dev (librpma, remote persistent memory access, and its headers for the test's program),
# and libgloo-dev (Gloo, the collectives library of PyTorch's distributed package, with g++).
need_pkgs=()
for p in binutils gcc libibverbs-dev librdmacm-dev ibverbs-utils rdmacm-utils perftest tshark \
    infiniband-diags \
    netcat-openbsd socat iperf3 iperf curl wget sockperf ucx-utils qperf openmpi-bin \
    libopenmpi-dev mpich libmpich-dev fio libfabric-bin python3-pyverbs valgrind iproute2 gdb \
    qemu-system-x86 tgt qemu-utils qemu-block-extra dapl2-utils hpcc \
    netpipe-openmpi ceph-mon ceph-osd librpma-dev libgloo-dev g++; do
    dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
# A machine image may carry a newer qemu-utils than Debian 12's (a backport), which Debian 12's
# qemu-system-x86 may not be installed beside: Debian 12's own is taken then.
if [[ " ${need_pkgs[*]} " == *" qemu-system-x86 "* ]] &&
    dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null | grep -q bpo; then
    need_pkgs+=("qemu-utils/bookworm")
fi
install_pkgs() {
    [ ${#need_pkgs[@]} -eq 0 ] && return 0
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --allow-downgrades "${need_pkgs[@]}"
    else
        echo "missing packages: ${need_pkgs[*]} (run as root to install them)" >&2
        exit 1
    fi
}

lint() {
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings
    # The Rust API's documentation builds without broken links.
    RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p rdma-emu
}

# The emulator's own tests under LeakSanitizer (nightly toolchain, a debug build: the engine's
# debug assertions run too). Any leak or failure fails it. Skipped where there is no nightly.
sanitize() {
    if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
        echo "sanitize: no nightly toolchain, skipped" >&2
        return 0
    fi
    # AddressSanitizer, with its LeakSanitizer (on by default on Linux): out-of-bounds and
    # use-after-free in the emulator's own code (std is not rebuilt instrumented: that, with
    # -Zbuild-std, is the longer run docs/reliability.md gives), and leaks.
    RUSTFLAGS="-Zsanitizer=address" CARGO_TARGET_DIR=target/sanitize \
        timeout 1500 cargo +nightly test -p rdma-emu --target x86_64-unknown-linux-gnu --lib --tests
    asan_fuzz
    tsan
}

# The C ABI's fuzzers (provider-shim/tests/fuzz) against libibverbs.so built with
# AddressSanitizer: an out-of-bounds access or a use after free in the shim's unsafe code
# fails them where it would not crash. The fuzzers are built with GCC's AddressSanitizer,
# whose runtime serves the Rust library's instrumentation too; librdmacm.so (forwarders into
# libibverbs.so, nothing to instrument) is the release build's. Longer:
# `ASAN_FUZZ_CASES=20000 ./ci.sh asan_fuzz`.
asan_fuzz() {
    local cases="${ASAN_FUZZ_CASES:-1500}" lib=target/sanitize/asan-shim f
    if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
        echo "asan_fuzz: no nightly toolchain, skipped" >&2
        return 0
    fi
    RUSTFLAGS="-Zsanitizer=address" CARGO_TARGET_DIR=target/sanitize \
        timeout 1200 cargo +nightly build --release -p rdma-emu-shim --target x86_64-unknown-linux-gnu
    mkdir -p "$lib"
    ln -sf "$PWD/target/sanitize/x86_64-unknown-linux-gnu/release/libibverbs.so" "$lib/libibverbs.so.1"
    ln -sf "$PWD/target/release/librdmacm.so" "$lib/librdmacm.so.1"
    for f in verbs_fuzz cm_fuzz; do
        gcc -std=gnu11 -O1 -g -fsanitize=address -fno-omit-frame-pointer -Wall -Wextra -Werror \
            -o "target/sanitize/$f" "provider-shim/tests/fuzz/$f.c" -lrdmacm -libverbs
        LD_LIBRARY_PATH="$lib" RDMA_EMU_FABRIC=none RDMA_EMU_SYSFS=target/sanitize/fuzz-sysfs \
            ASAN_OPTIONS=detect_leaks=0 timeout 900 "target/sanitize/$f" 1 "$cases" | tail -n 20
        [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "asan_fuzz: $f failed" >&2; return 1; }
    done
}

# ThreadSanitizer over the emulator's tests, std rebuilt instrumented (it needs the nightly's
# rust-src; a data race fails the run). The `tsan` feature tells TSan how the host fabric's
# rings order memory (docs/reliability.md). Left out: maxima.rs, a million objects of each
# kind, too much for TSan's shadow memory.
tsan() {
    if ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'; then
        echo "tsan: the nightly toolchain has no rust-src, skipped" >&2
        return 0
    fi
    local args=() f n
    for f in emu/tests/*.rs; do
        n=$(basename "$f" .rs)
        case "$n" in maxima) ;; *) args+=(--test "$n") ;; esac
    done
    RUSTFLAGS="-Zsanitizer=thread" CARGO_TARGET_DIR=target/tsan \
        timeout 1500 cargo +nightly test -Zbuild-std --target x86_64-unknown-linux-gnu \
        -p rdma-emu --features tsan --lib "${args[@]}"
}

case "${1:-test}" in
    test)
        install_pkgs
        lint
        # The shim's tests run the built libibverbs.so, which `cargo test` does not rebuild.
        cargo build --workspace --release
        # The tests' binaries built first, outside the timeout below (their build takes ~8 of
        # the ~18 minutes, which left the timeout ~2 minutes to spare on a 2-core machine).
        cargo test --workspace --release --no-run
        # A hang must fail CI quickly, not eat its 90 minutes.
        timeout 1200 cargo test --workspace --release
        sanitize
        ./target/release/rdma-emu demo
        ;;
    lint) lint ;;
    sanitize) sanitize ;;
    asan_fuzz) asan_fuzz ;;
    tsan) tsan ;;
    bench)
        cargo build --release -p rdma-emu-benches
        ./target/release/ratios "${@:2}"
        # The engine's cost per work request, counted (stable where timings are not).
        if command -v valgrind > /dev/null; then
            n=20000
            valgrind --tool=callgrind --toggle-collect='*measured_loop*' \
                --callgrind-out-file=target/wr_cost.callgrind ./target/release/wr_cost $n 2>&1 |
                awk -v n=$n '/Collected/ { printf "instructions per 8-byte WRITE + poll: %d\n", $4 / n }'
            # The same through the C ABI (`ibv_post_send`/`ibv_poll_cq` on the shim), with the
            # C program the G3b figure runs (built by `ratios` when it measures G3b).
            if [ -x target/release/cabi-bench ]; then
                LD_LIBRARY_PATH=target/release/shim valgrind --tool=callgrind \
                    --toggle-collect=measured_loop --callgrind-out-file=target/cabi.callgrind \
                    ./target/release/cabi-bench $n 0 2>&1 |
                    awk -v n=$n '/Collected/ { printf "instructions per 8-byte WRITE + poll, C ABI: %d\n", $4 / n }'
                # One hop of the C ping-pong in one thread (a SEND, its receive completion
                # polled, a receive posted again), over its 1,000 rounds of warm-up too.
                LD_LIBRARY_PATH=target/release/shim valgrind --tool=callgrind \
                    --toggle-collect=measured_hop --callgrind-out-file=target/cabi_hop.callgrind \
                    ./target/release/cabi-bench 0 0 $n 2>&1 |
                    awk -v n=$((n + 1000)) '/Collected/ { printf "instructions per 8-byte SEND hop, C ABI: %d\n", $4 / n }'
            fi
            # Across the host fabric (two fabrics joined as two processes are): a SEND, its
            # receive and the ACK that completes it: the receive and the SEND posted, each
            # message taken in and delivered (the empty looks between them, as many as the
            # fabrics' own threads make, are not counted), over the 1,000 rounds of warm-up
            # too; the fewest of three runs (a retransmission under valgrind's slowness adds).
            # (The toggles name the functions the Rust API's `post_send` and `post_recv` call:
            # were they inlined or renamed, callgrind would count nothing of the posts.)
            rounds=$((n / 10))
            for _ in 1 2 3; do
                valgrind --tool=callgrind --fair-sched=yes --callgrind-out-file=target/wr_cost_host.callgrind \
                    --toggle-collect='*Qp>::post_list' --toggle-collect='*responder::post_recv' \
                    --toggle-collect='*host::receive::receive_marked' \
                    ./target/release/wr_cost $rounds --host --op send 2>&1 |
                    awk '/Collected/ { print $4 }'
            done | sort -n | head -1 |
                awk -v n=$((rounds + 1000)) '{ printf "instructions per cross-process 8-byte SEND + ACK: %d\n", $1 / n }'
        fi
        ;;
    *) echo "usage: $0 [test|lint|bench|sanitize|asan_fuzz|tsan]" >&2; exit 2 ;;
esac
