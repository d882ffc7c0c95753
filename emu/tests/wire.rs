//! Wire ports: two fabrics, each with a port bound to its own loopback address, reach each
//! other only over RoCE v2 on UDP port 4791 (no host fabric): every RC operation, messages cut
//! into many packets and put back together, UD, and what a hostile datagram gets.

mod common;

use std::net::{IpAddr, Ipv4Addr, UdpSocket};

use common::*;
use rdma_emu::{cm::addr::PortAddress, *};

/// One wire port's fabric: rxe's profile, device `emu0` port 1 at `ip`, no host fabric.
fn wired(ip: [u8; 4]) -> Fabric {
    let wire = vec![PortAddress { ip: IpAddr::from(ip), device: 0, port: 1 }];
    let cfg =
        FabricConfig { devices: 1, profile: Profile::Rxe, host: None, wire, ..Default::default() };
    Fabric::try_new(cfg).expect("loopback addresses bind")
}

/// The GID index of `ip` in port 1 of `dev`.
fn gid_index(dev: &Device, ip: [u8; 4]) -> u8 {
    let gid = Gid::of_ip(IpAddr::from(ip));
    let e = dev.gid_table(1).unwrap().into_iter().find(|e| e.gid == gid).expect("the wire GID");
    e.index as u8
}

/// Node `n` (at `ip`) connected to `peer` (at `peer_ip`) over the wire.
fn connect_over(n: &Node, ip: [u8; 4], peer: &Node, peer_ip: [u8; 4], p: &RcParams) {
    let sgid_index = gid_index(&n.ctx.device(), ip);
    let remote = Endpoint {
        qpn: peer.qp.qp_num(),
        lid: 0,
        gid: Gid::of_ip(IpAddr::from(peer_ip)),
        psn: 0x20,
    };
    n.qp.connect(0x20, &remote, &RcParams { sgid_index, ..*p }).unwrap();
}

const A: [u8; 4] = [127, 0, 0, 41];
const B: [u8; 4] = [127, 0, 0, 42];

/// Orders what `n`'s wire thread did to its memory before what this thread does next (and
/// the other way round) through the QP's lock, which both take. A completion that came
/// through a socket orders them too, but ThreadSanitizer cannot see through the kernel.
fn sync_with(n: &Node) {
    n.qp.query().unwrap();
}

/// Two fabrics whose nodes are connected over the wire, with path MTU `mtu`.
fn wired_pair(a_ip: [u8; 4], b_ip: [u8; 4], mtu: Mtu) -> (Fabric, Fabric, Node, Node) {
    wired_pair_with(a_ip, b_ip, &RcParams { path_mtu: mtu, ..Default::default() })
}

fn wired_pair_with(a_ip: [u8; 4], b_ip: [u8; 4], p: &RcParams) -> (Fabric, Fabric, Node, Node) {
    let (fa, fb) = (wired(a_ip), wired(b_ip));
    let a = node_on(&fa.devices()[0], 1 << 20);
    let b = node_on(&fb.devices()[0], 1 << 20);
    connect_over(&a, a_ip, &b, b_ip, p);
    connect_over(&b, b_ip, &a, a_ip, p);
    (fa, fb, a, b)
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn every_rc_operation_crosses_the_wire_between_two_fabrics() {
    let (_fa, _fb, a, b) = wired_pair(A, B, Mtu::MTU_1024);
    // A WRITE of 10,000 bytes: ten packets at MTU 1024, put back together at B.
    let data = pattern(10_000, 1);
    a.mr.write(0, &data).unwrap();
    let w = [sge(&a.mr, 0, data.len())];
    a.qp.post_send(&SendWr::write(1, &w, b.mr.addr() + 4096, b.mr.rkey()).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    sync_with(&b);
    let mut got = vec![0u8; data.len()];
    b.mr.read(4096, &mut got).unwrap();
    assert!(got == data, "the WRITE's bytes landed");

    // A SEND with immediate of 3,000 bytes into a posted receive.
    post_recv(&b.qp, 7, &[sge(&b.mr, 65536, 4096)]);
    let msg = pattern(3000, 2);
    a.mr.write(20_000, &msg).unwrap();
    let s = [sge(&a.mr, 20_000, msg.len())];
    a.qp.post_send(&SendWr::send(2, &s).with_imm(0x0102_0304).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    let wc = wait1(&b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len, wc.imm_data),
        (7, WcStatus::SUCCESS, 3000, 0x0102_0304)
    );
    let mut got = vec![0u8; msg.len()];
    b.mr.read(65536, &mut got).unwrap();
    assert!(got == msg, "the SEND's bytes landed");

    // A READ of 5,000 bytes: a five-packet response from B.
    let remote = pattern(5000, 3);
    b.mr.write(100_000, &remote).unwrap();
    sync_with(&b);
    let r = [sge(&a.mr, 200_000, remote.len())];
    a.qp.post_send(&SendWr::read(3, &r, b.mr.addr() + 100_000, b.mr.rkey()).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    let mut got = vec![0u8; remote.len()];
    a.mr.read(200_000, &mut got).unwrap();
    assert!(got == remote, "the READ's bytes came back");

    // Atomics: fetch-and-add then compare-and-swap on one word of B.
    b.mr.write(8, &40u64.to_ne_bytes()).unwrap();
    sync_with(&b);
    let o = [sge(&a.mr, 300_000, 8)];
    a.qp.post_send(&SendWr::fetch_add(4, &o, b.mr.addr() + 8, b.mr.rkey(), 2).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    let mut old = [0u8; 8];
    a.mr.read(300_000, &mut old).unwrap();
    assert_eq!(u64::from_ne_bytes(old), 40);
    let swap = SendWr::cmp_swap(5, &o, b.mr.addr() + 8, b.mr.rkey(), 42, 7).signaled();
    a.qp.post_send(&swap).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    sync_with(&b);
    let mut now = [0u8; 8];
    b.mr.read(8, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 7, "42 was there (40 + 2), so 7 was swapped in");

    // A bad rkey is NAKed across the wire as it is within a fabric.
    let bad = SendWr::write(6, &w, b.mr.addr(), b.mr.rkey() ^ 0x100).signaled();
    a.qp.post_send(&bad).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::REM_ACCESS_ERR);
    assert_eq!(_fb.wire_drops(), Some(WireDrops::default()), "B refused nothing");
}

#[test]
fn many_messages_in_flight_both_ways_keep_order_and_bytes() {
    let (_fa, _fb, a, b) = wired_pair([127, 0, 0, 43], [127, 0, 0, 44], Mtu::MTU_4096);
    exchange(&a, &b);
}

/// A's fault rules drop a tenth of the messages it sends and of those it takes in (as a lossy
/// network would, both ways): retransmission over the wire recovers every one, in order. (A
/// timeout of ~67 ms: on a loaded machine a shorter one also fires while the peer is merely
/// not scheduled, and eight of those in a row end the connection: 1 ms did on a CI machine,
/// then ~17 ms once in the AddressSanitizer run, six tests at once on two cores.)
#[test]
fn losses_on_the_wire_both_ways_are_recovered_by_retransmission() {
    let p = RcParams { path_mtu: Mtu::MTU_1024, timeout: 14, retry_cnt: 7, ..Default::default() };
    let (fa, _fb, a, b) = wired_pair_with([127, 0, 0, 50], [127, 0, 0, 53], &p);
    fa.set_faults(FaultRule::parse("drop:p=0.1").unwrap());
    exchange(&a, &b);
    assert!(fa.fault_hits()[0] > 0, "the rule dropped messages");
}

/// 48 SENDs of 1 to 7,051 bytes each way at once, checked in order with their bytes.
fn exchange(a: &Node, b: &Node) {
    const N: usize = 48;
    for i in 0..N {
        post_recv(&b.qp, i as u64, &[sge(&b.mr, i * 8192, 8192)]);
        post_recv(&a.qp, i as u64, &[sge(&a.mr, 512 * 1024 + i * 8192, 8192)]);
    }
    for i in 0..N {
        let len = 1 + i * 150;
        a.mr.write(i * 8192, &pattern(len, i as u8)).unwrap();
        b.mr.write(512 * 1024 + i * 8192, &pattern(len, 100 + i as u8)).unwrap();
    }
    for i in 0..N {
        let len = 1 + i * 150;
        let sa = [sge(&a.mr, i * 8192, len)];
        a.qp.post_send(&SendWr::send(i as u64, &sa)).unwrap();
        let sb = [sge(&b.mr, 512 * 1024 + i * 8192, len)];
        b.qp.post_send(&SendWr::send(i as u64, &sb)).unwrap();
    }
    // Each side gets its N receives, in order, with the other's bytes (and no completion
    // for the unsignaled sends).
    for (n, got_at, seed) in [(b, 0, 0u8), (a, 512 * 1024, 100)] {
        let wcs = wait_n(&n.cq, N);
        for (i, wc) in wcs.iter().enumerate() {
            let len = 1 + i * 150;
            assert_eq!(
                (wc.wr_id, wc.status, wc.byte_len),
                (i as u64, WcStatus::SUCCESS, len as u32)
            );
            let mut got = vec![0u8; len];
            n.mr.read(got_at + i * 8192, &mut got).unwrap();
            assert!(got == pattern(len, seed + i as u8), "message {i}");
        }
    }
}

#[test]
fn ud_datagrams_cross_the_wire_with_the_senders_address_in_the_grh() {
    let (fa, fb) = (wired([127, 0, 0, 45]), wired([127, 0, 0, 46]));
    let a = node_on(&fa.devices()[0], 1 << 16);
    let b = node_on(&fb.devices()[0], 1 << 16);
    let (qa, qb) = (ud_qp(&a, 0x1111, 16), ud_qp(&b, 0x1111, 16));
    post_recv(&qb, 9, &[sge(&b.mr, 0, 40 + 64)]);
    let ah =
        a.pd.create_ah(&AhAttr {
            is_global: true,
            dgid: Gid::of_ip(IpAddr::from([127, 0, 0, 46])),
            sgid_index: gid_index(&a.ctx.device(), [127, 0, 0, 45]),
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        })
        .expect("a GID beyond the wire port is reachable");
    a.mr.write(0, b"over the wire").unwrap();
    let s = [sge(&a.mr, 0, 13)];
    qa.post_send(&SendWr::send_ud(1, &s, &ah, qb.qp_num(), 0x1111)).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    let wc = wait1(&b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len, wc.src_qp),
        (9, WcStatus::SUCCESS, 53, qa.qp_num())
    );
    let mut got = [0u8; 53];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(&got[40..], b"over the wire");
    // The GRH area holds the IPv4 header the datagram came with: from A to B.
    assert_eq!(&got[20 + 12..20 + 16], &[127, 0, 0, 45]);
    assert_eq!(&got[20 + 16..20 + 20], &[127, 0, 0, 46]);
}

#[test]
fn hostile_datagrams_are_counted_and_dropped_and_the_port_goes_on() {
    let (_fa, fb, a, b) = wired_pair([127, 0, 0, 47], [127, 0, 0, 48], Mtu::MTU_1024);
    let s = UdpSocket::bind((Ipv4Addr::new(127, 0, 0, 47), 0)).unwrap();
    let to = (Ipv4Addr::new(127, 0, 0, 48), 4791);
    let qpn = b.qp.qp_num().to_be_bytes();
    // A WRITE_ONLY to B's QP with a made-up ICRC; a datagram too short for a BTH; garbage
    // (its ICRC would be wrong too, but it is malformed first); the WRITE with a right ICRC
    // to a QP B does not have.
    let mut write = vec![0x0a, 0, 0xff, 0xff, 0, qpn[1], qpn[2], qpn[3], 0x80, 0, 0, 0x20];
    write.extend_from_slice(&b.mr.addr().to_be_bytes());
    write.extend_from_slice(&b.mr.rkey().to_be_bytes());
    write.extend_from_slice(&4u32.to_be_bytes());
    write.extend_from_slice(b"evil");
    // Over IPv4 a receiver solves for the IP identification the ICRC covers, so one made-up
    // ICRC in 65,536 checks under some identification: pick one that checks under none.
    let sport = s.local_addr().unwrap().port();
    let (from, at) = ([127, 0, 0, 47], [127, 0, 0, 48]);
    let icrcs: Vec<u32> = icrcs_v4(from, at, sport, &write).collect();
    let bad = (0u32..).find(|c| !icrcs.contains(c)).unwrap();
    let mut nowhere = write.clone();
    nowhere[5..8].copy_from_slice(&(b.qp.qp_num() + 1).to_be_bytes()[1..]);
    let right = icrcs_v4(from, at, sport, &nowhere).nth(0x1234).unwrap();
    nowhere.extend_from_slice(&right.to_le_bytes());
    write.extend_from_slice(&bad.to_le_bytes());
    for d in [&write[..], &[1, 2, 3][..], &[0xff; 64][..], &nowhere[..]] {
        s.send_to(d, to).unwrap();
    }
    // The port still serves its connection (and the datagrams before it were taken first).
    a.mr.write(0, b"fine").unwrap();
    let w = [sge(&a.mr, 0, 4)];
    a.qp.post_send(&SendWr::write(1, &w, b.mr.addr() + 64, b.mr.rkey()).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    sync_with(&b);
    let mut got = [0u8; 4];
    b.mr.read(0, &mut got).unwrap();
    assert_ne!(&got, b"evil", "the forged WRITE did not land");
    let drops = fb.wire_drops().unwrap();
    assert_eq!((drops.bad_icrc, drops.malformed, drops.unknown_qp), (1, 2, 1), "{drops:?}");
}

/// The ICRC of the RoCE v2 datagram `body` (BTH onwards, without the ICRC) from `src:sport`
/// to `dst`, for each IPv4 identification in turn (IBA Annex A17.3.3, computed here as an
/// oracle independent of the wire port's solver): 64 one-bits for the LRH, the IPv4 header
/// with TOS, TTL and checksum masked, the UDP header with its checksum masked, the BTH with its
/// reserved byte masked, the rest.
fn icrcs_v4(src: [u8; 4], dst: [u8; 4], sport: u16, body: &[u8]) -> impl Iterator<Item = u32> {
    let udp_len = (8 + body.len() + 4) as u16;
    let mut ip = vec![0x45, 0xff];
    ip.extend_from_slice(&(20 + udp_len).to_be_bytes());
    ip.extend_from_slice(&[0, 0, 0x40, 0, 0xff, 17, 0xff, 0xff]);
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    ip.extend_from_slice(&sport.to_be_bytes());
    ip.extend_from_slice(&4791u16.to_be_bytes());
    ip.extend_from_slice(&udp_len.to_be_bytes());
    ip.extend_from_slice(&[0xff, 0xff]);
    let bth_at = ip.len();
    ip.extend_from_slice(body);
    ip[bth_at + 4] = 0xff;
    (0..=u16::MAX).map(move |id| {
        ip[4..6].copy_from_slice(&id.to_be_bytes());
        let mut h = crc32fast::Hasher::new();
        h.update(&[0xff; 8]);
        h.update(&ip);
        h.finalize()
    })
}

#[test]
fn a_wire_port_needs_an_ethernet_port_and_a_free_address() {
    let wire = vec![PortAddress { ip: IpAddr::from([127, 0, 0, 49]), device: 0, port: 1 }];
    let ib = FabricConfig { host: None, wire: wire.clone(), ..Default::default() };
    assert_eq!(Fabric::try_new(ib).unwrap_err().errno(), Errno::EINVAL);
    let first = wired([127, 0, 0, 49]);
    let again = FabricConfig { host: None, profile: Profile::Rxe, wire, ..Default::default() };
    assert_eq!(Fabric::try_new(again).unwrap_err().errno(), Errno::EADDRINUSE);
    drop(first);
    // Once the first fabric is gone, its address is free at once.
    let _second = wired([127, 0, 0, 49]);
}
