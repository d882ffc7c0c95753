#!/bin/bash
# The wire port against the kernel's rxe (docs/wire.md). Runs in the rxe VM with rxe0 on veth0
# (10.0.4.1); veth1 (10.0.4.2) goes into a network namespace standing in for another host,
# where Debian's unmodified tools run on the emulator (`rdma-emu run --wire 10.0.4.2`). Both
# netdevs get jumbo frames, so the ports' MTU is 4096 on both sides. Each program runs twice:
# the emulator as server, then as client (so RNR NAKs, below, go both ways); the `lossy-` runs also drop 2% of the messages the
# emulator sends and of those it takes in (its fault rules), so both sides must retransmit.
# Prints one line per run and exits 0 when every run passed.
# `imm` runs conformance/wire/rxe_imm.c (SEND and WRITE with immediate; Debian's tools use
# neither) on both sides.
#   cargo build --release --workspace
#   cc -O1 -o target/rxe_imm conformance/wire/rxe_imm.c -libverbs
#   RXE_VM_NETDEVS=veth0 ../shared/rxe-vm/run.sh 'bash conformance/wire/rxe_interop.sh'
# Optional: the programs to run (names from the list below), e.g. `... rxe_interop.sh rc ud`.
# With RXE_INTEROP_IP6=1 the RoCE traffic goes over IPv6 (fd77::1 and fd77::2 beside the IPv4
# addresses, which still carry the programs' own TCP exchange): the GIDs used are the IPv6 ones.
set -u
E=$PWD/target/release/rdma-emu
[ -x "$E" ] || { echo "no $E: cargo build --release --workspace"; exit 2; }
ip netns add peer
ip link set veth1 netns peer
ip link set veth0 mtu 9000
ip netns exec peer ip addr add 10.0.4.2/24 dev veth1
ip netns exec peer ip link set veth1 mtu 9000 up
ip netns exec peer ip link set lo up
# The addresses the RoCE traffic uses: rxe's, the emulator's.
A_RXE=10.0.4.1 A_EMU=10.0.4.2
if [ "${RXE_INTEROP_IP6:-0}" = 1 ]; then
    A_RXE=fd77::1 A_EMU=fd77::2
    ip addr add fd77::1/64 dev veth0 nodad
    ip netns exec peer ip addr add fd77::2/64 dev veth1 nodad
    sleep 1
fi
# EMU_OPTS: more `rdma-emu run` options for the run at hand.
emu() {
    # shellcheck disable=SC2086
    ip netns exec peer "$E" run --profile rxe --fabric none --mtu 9000 --wire "$A_EMU" \
        ${EMU_OPTS:-} -- "$@"
}
# The GID index of an address in a device's table (as ibv_devinfo lists it: an IPv4 address
# mapped, an IPv6 one as it is).
gid_of() { sed -n "s/.*GID\[ *\([0-9]*\)\]:[[:space:]]*\(::ffff:\)\{0,1\}$1, RoCE v2.*/\1/p" | head -1; }
egid=$(emu ibv_devinfo -d emu0 -v | gid_of "$A_EMU")
rgid=$(ibv_devinfo -d rxe0 -v | gid_of "$A_RXE")
echo "emu0 GID index $egid ($A_EMU), rxe0 GID index $rgid ($A_RXE), $(uname -r)"
failed=0
# both NAME SERVER LOG: runs `side server` on SERVER (emu or rxe) and `side client` on the other
# (`side ROLE WHERE` is the program's own), then says PASS with the last line of LOG (client or
# server) or FAIL with both logs' tails.
both() {
    local name=$1 server=$2 log=$3 t0=$SECONDS s c sv other=emu
    [ "$server" = emu ] && other=rxe
    side server "$server" > /tmp/server.log 2>&1 &
    s=$!
    sleep 1
    side client "$other" > /tmp/client.log 2>&1
    c=$?
    wait "$s"
    sv=$?
    if [ "$c" = 0 ] && [ "$sv" = 0 ]; then
        echo "PASS $name (server on $server, $((SECONDS - t0)) s): $(grep -E 'iters|^ *[0-9]+ +[0-9]+|^ok|ping data|complete' "/tmp/$log.log" | tail -1 | cut -c1-100)"
    else
        failed=1
        echo "FAIL $name (server on $server): client $c, server $sv"
        sed 's/^/  client: /' /tmp/client.log | tail -8
        sed 's/^/  server: /' /tmp/server.log | tail -8
    fi
}
# run NAME SERVER GIDFLAG PROGRAM ARGS...: a program that takes -d DEVICE GIDFLAG INDEX ARGS and,
# as client, the server's address (the pingpongs, perftest).
run() {
    local name=$1 server=$2
    G=$3 PROG=$4
    shift 4
    ARGS=("$@")
    side() {
        case "$1/$2" in
        server/emu) emu timeout 120 "$PROG" -d emu0 "$G" "$egid" "${ARGS[@]}" ;;
        server/rxe) timeout 120 "$PROG" -d rxe0 "$G" "$rgid" "${ARGS[@]}" ;;
        client/emu) emu timeout 120 "$PROG" -d emu0 "$G" "$egid" "${ARGS[@]}" 10.0.4.1 ;;
        client/rxe) timeout 120 "$PROG" -d rxe0 "$G" "$rgid" "${ARGS[@]}" 10.0.4.2 ;;
        esac
    }
    both "$name" "$server" client
}
# run_imm SERVER: rxe_imm as server on SERVER (emu or rxe), as client on the other.
run_imm() {
    I=$PWD/target/rxe_imm
    if [ ! -x "$I" ]; then
        failed=1
        echo "FAIL imm: no $I (cc -O1 -o target/rxe_imm conformance/wire/rxe_imm.c -libverbs)"
        return
    fi
    side() {
        case "$1/$2" in
        server/emu) emu timeout 60 "$I" server "$A_EMU" 19700 ;;
        server/rxe) timeout 60 "$I" server "$A_RXE" 19700 ;;
        client/emu) emu timeout 60 "$I" client "$A_EMU" 10.0.4.1 19700 ;;
        client/rxe) timeout 60 "$I" client "$A_RXE" 10.0.4.2 19700 ;;
        esac
    }
    both imm "$1" server
}
# run_cm NAME SERVER STYLE PROGRAM ARGS...: a program that connects through rdma_cm (the IB
# CM's MADs on the wire), each side on its RoCE address. STYLE a: rping's flags (-s or -c,
# -a ADDRESS: the server binds its own, the client connects to the other's); b: those of
# rdmacm-utils (-b OWN, and for the client -s SERVER).
run_cm() {
    local name=$1 server=$2 style=$3
    PROG=$4
    shift 4
    ARGS=("$@")
    side() {
        local own=$A_EMU other=$A_RXE run=emu flags
        [ "$2" = rxe ] && own=$A_RXE other=$A_EMU run=
        case "$style/$1" in
        a/server) flags=(-s -a "$own") ;;
        a/client) flags=(-c -a "$other") ;;
        b/server) flags=(-b "$own") ;;
        b/client) flags=(-s "$other" -b "$own") ;;
        esac
        $run timeout 60 "$PROG" "${flags[@]}" "${ARGS[@]}"
    }
    both "$name" "$server" client
}
# run_cmtime SERVER: cmtime's client makes 50 connections at once to the server on SERVER and
# ends them; the server serves until it is stopped, so only the client's status counts.
run_cmtime() {
    local server=$1 t0=$SECONDS c
    if [ "$server" = emu ]; then
        emu timeout 60 cmtime -b "$A_EMU" -p 7182 > /tmp/server.log 2>&1 &
        sleep 1
        timeout 60 cmtime -s "$A_EMU" -b "$A_RXE" -p 7182 -c 50 > /tmp/client.log 2>&1
    else
        timeout 60 cmtime -b "$A_RXE" -p 7182 > /tmp/server.log 2>&1 &
        sleep 1
        emu timeout 60 cmtime -s "$A_RXE" -b "$A_EMU" -p 7182 -c 50 > /tmp/client.log 2>&1
    fi
    c=$?
    # The server itself (under rdma-emu run, in the namespace, or not), not only its wrapper.
    kill $(pidof cmtime) 2>/dev/null
    wait
    if [ "$c" = 0 ]; then
        echo "PASS cmtime (server on $server, $((SECONDS - t0)) s): $(grep '^connect *:' /tmp/client.log | tr -s ' ')"
    else
        failed=1
        echo "FAIL cmtime (server on $server): client $c"
        sed 's/^/  client: /' /tmp/client.log | tail -8
    fi
}
# want NAME [WANTED...]: whether NAME is among the programs asked for (all when none are).
want() {
    local name=$1
    shift
    [ $# -eq 0 ] || [[ " $* " == *" $name "* ]]
}
for server in emu rxe; do
    want rc "$@" && run rc "$server" -g ibv_rc_pingpong -n 200 -s 4096 -m 1024 -c
    want rc-mtu4096 "$@" && run rc-mtu4096 "$server" -g ibv_rc_pingpong -n 50 -s 20000 -m 4096 -c
    want uc "$@" && run uc "$server" -g ibv_uc_pingpong -n 200 -s 1024 -m 1024 -c
    want ud "$@" && run ud "$server" -g ibv_ud_pingpong -n 200 -s 512 -c
    want write_bw "$@" && run write_bw "$server" -x ib_write_bw -n 500 -s 65536 -F
    want read_bw "$@" && run read_bw "$server" -x ib_read_bw -n 500 -s 16384 -F
    want send_lat "$@" && run send_lat "$server" -x ib_send_lat -n 500 -s 64 -F
    want atomic_bw "$@" && run atomic_bw "$server" -x ib_atomic_bw -n 500 -F
    want atomic_cs "$@" && run atomic_cs "$server" -x ib_atomic_bw -n 500 -A CMP_AND_SWAP -F
    want imm "$@" && run_imm "$server"
    # Connected through rdma_cm: REQ, REP, RTU, DREQ and DREP between the two CMs. rping checks
    # every ping's bytes (-V); perftest's -R connects its QPs through rdma_cm (IPv4 only).
    want rping "$@" && run_cm rping "$server" a rping -p 7174 -C 100 -S 2000 -V -v
    # Two connections of SENDs (ucmatose, RC) and UD datagrams addressed through SIDR (udaddy).
    want ucmatose "$@" && run_cm ucmatose "$server" b ucmatose -c 2 -C 100 -S 1000
    want udaddy "$@" && run_cm udaddy "$server" b udaddy -c 2 -C 100 -S 512
    want cmtime "$@" && run_cmtime "$server"
    if [ "$A_RXE" = 10.0.4.1 ]; then
        want write_bw_cm "$@" && run write_bw_cm "$server" -x ib_write_bw -n 500 -s 65536 -F -R
        want send_lat_cm "$@" && run send_lat_cm "$server" -x ib_send_lat -n 500 -s 64 -F -R
    fi
    # Two receives posted ahead (-r 2) for a stream of SENDs: the server's side answers RNR
    # NAKs, which the client's side must wait out and retry.
    want rnr "$@" && run rnr "$server" -x ib_send_bw -n 300 -s 4096 -r 2 -F
    export EMU_OPTS="--faults drop:p=0.02"
    want lossy-rc "$@" && run lossy-rc "$server" -g ibv_rc_pingpong -n 100 -s 8192 -m 1024 -c
    want lossy-write_bw "$@" && run lossy-write_bw "$server" -x ib_write_bw -n 300 -s 16384 -F
    want lossy-read_bw "$@" && run lossy-read_bw "$server" -x ib_read_bw -n 300 -s 16384 -F
    unset EMU_OPTS
done
exit "$failed"
