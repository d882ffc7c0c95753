#!/bin/bash
# Debian's ib_write_bw (1 MiB messages) and ib_send_lat (8 bytes) between two processes on the
# shim, three ways on this machine: on the host fabric, over wire ports on two loopback
# addresses, and (as root) over wire ports in two network namespaces joined by a veth pair
# with jumbo frames. Prints one table row per way (median of RUNS runs each, default 3).
#   cargo build --release --workspace && bash benches/wire.sh
set -u
cd "$(dirname "$0")/.."
E=$PWD/target/release/rdma-emu
[ -x "$E" ] || { echo "no $E: cargo build --release --workspace"; exit 2; }
RUNS=${RUNS:-3}
last=$(tr ',-' '\n\n' < /sys/devices/system/cpu/online | tail -1)

# side WAY ROLE: the command prefix of one side (ROLE server or client).
side() {
    local mtu="--mtu 9000"
    case "$1/$2" in
    host/*) echo "taskset -c $3 $E run --profile rxe --fabric bench-wire-$$ -- " ;;
    loopback/server) echo "taskset -c $3 $E run --profile rxe --fabric none $mtu --wire 127.0.2.1 -- " ;;
    loopback/client) echo "taskset -c $3 $E run --profile rxe --fabric none $mtu --wire 127.0.2.2 -- " ;;
    netns/server) echo "ip netns exec bwa-$$ taskset -c $3 $E run --profile rxe --fabric none $mtu --wire 10.78.0.1 -- " ;;
    netns/client) echo "ip netns exec bwb-$$ taskset -c $3 $E run --profile rxe --fabric none $mtu --wire 10.78.0.2 -- " ;;
    esac
}
# gid WAY: the GID index of the side's address (the wire address is configured first: 2;
# on the host fabric the device's own address, 1).
gid() { [ "$1" = host ] && echo 1 || echo 2; }
server_addr() { case "$1" in netns) echo 10.78.0.1 ;; *) echo 127.0.0.1 ;; esac; }

# once WAY PROG COLUMN ARGS...: the client's COLUMNth figure of one run.
once() {
    local way=$1 prog=$2 col=$3
    shift 3
    local port=$((20000 + RANDOM % 20000))
    # shellcheck disable=SC2046
    $(side "$way" server "$last") "$prog" -d emu0 -x "$(gid "$way")" -F -p "$port" "$@" > /dev/null 2>&1 &
    sleep 1
    # shellcheck disable=SC2046
    $(side "$way" client 0) "$prog" -d emu0 -x "$(gid "$way")" -F -p "$port" "$@" "$(server_addr "$way")" 2>/dev/null |
        awk -v c="$col" '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ { v = $c } END { print v }'
    wait
}
median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
measure() {
    local way=$1 bw lat
    bw=$(for _ in $(seq "$RUNS"); do once "$way" ib_write_bw 4 -s 1048576 -n 500; done | median)
    lat=$(for _ in $(seq "$RUNS"); do once "$way" ib_send_lat 6 -s 8 -n 5000; done | median)
    printf '| %-40s | %10s | %10s |\n' "$2" "$bw" "$lat"
}

echo "| two processes on the shim (rxe profile)  | write_bw MB/s | send_lat avg us |"
echo "|---|---|---|"
measure host "host fabric (shared-memory rings)"
measure loopback "wire ports, loopback (127.0.2.1/2)"
if [ "$(id -u)" = 0 ] && command -v ip > /dev/null; then
    ip netns add "bwa-$$" && ip netns add "bwb-$$"
    ip link add "bva$$" type veth peer name "bvb$$"
    ip link set "bva$$" netns "bwa-$$" && ip link set "bvb$$" netns "bwb-$$"
    ip netns exec "bwa-$$" ip addr add 10.78.0.1/24 dev "bva$$"
    ip netns exec "bwb-$$" ip addr add 10.78.0.2/24 dev "bvb$$"
    for n in a b; do
        ip netns exec "bw$n-$$" ip link set "bv$n$$" mtu 9000 up
        ip netns exec "bw$n-$$" ip link set lo up
    done
    measure netns "wire ports, two namespaces, veth (MTU 9000)"
    ip netns del "bwa-$$"
    ip netns del "bwb-$$"
else
    echo "(two namespaces: skipped, needs root and iproute2)"
fi
