//! UD: address handles, Q_Keys, the 40-byte GRH area, `src_qp`, the MTU limit, silent drops.

mod common;
use common::*;
use rdma_emu::*;

const QKEY: u32 = 0x1111_2222;

struct Ud {
    n: Node,
    qp: Qp,
}

fn pair(profile: Profile) -> (Fabric, Ud, Ud) {
    pair_on(FabricConfig { devices: 2, profile, ..Default::default() })
}

/// A pair on RoCE ports (the full profile's ports are InfiniBand unless asked).
fn roce_pair(profile: Profile) -> (Fabric, Ud, Ud) {
    pair_on(FabricConfig {
        devices: 2,
        profile,
        link_layer: LinkLayer::ETHERNET,
        ..Default::default()
    })
}

fn pair_on(cfg: FabricConfig) -> (Fabric, Ud, Ud) {
    let f = Fabric::new(cfg);
    let devs = f.devices();
    let mk = |d: &Device| {
        let n = node_on(d, 8192);
        let qp = ud_qp(&n, QKEY, 16);
        Ud { n, qp }
    };
    let (a, b) = (mk(&devs[0]), mk(&devs[1]));
    (f, a, b)
}

/// An address handle on `from`'s PD that leads to `to`'s port 1.
fn ah_to(from: &Ud, to: &Ud) -> Ah {
    let ep = to.qp.endpoint(0);
    let roce = to.n.ctx.query_port(1).unwrap().link_layer == LinkLayer::ETHERNET;
    let attr = AhAttr {
        is_global: roce,
        dgid: ep.gid,
        dlid: ep.lid,
        port_num: 1,
        hop_limit: 64,
        ..Default::default()
    };
    from.n.pd.create_ah(&attr).unwrap()
}

#[test]
fn ud_datagram_lands_after_the_grh_with_src_qp() {
    for profile in [Profile::Full, Profile::Rxe] {
        let (_f, a, b) = pair(profile);
        let ah = ah_to(&a, &b);
        a.n.mr.write(0, b"datagram!").unwrap();
        post_recv(&b.qp, 5, &[sge(&b.n.mr, 0, 40 + 64)]);
        a.qp.post_send(&SendWr::send_ud(1, &[sge(&a.n.mr, 0, 9)], &ah, b.qp.qp_num(), QKEY))
            .unwrap();
        let s = wait1(&a.n.cq);
        assert_eq!((s.status, s.opcode, s.byte_len), (WcStatus::SUCCESS, WcOpcode::SEND, 9));
        let r = wait1(&b.n.cq);
        assert_eq!((r.wr_id, r.status, r.opcode), (5, WcStatus::SUCCESS, WcOpcode::RECV));
        assert_eq!(r.byte_len, 40 + 9, "byte_len counts the GRH area");
        assert_eq!(r.src_qp, a.qp.qp_num());
        let mut got = [0u8; 9];
        b.n.mr.read(40, &mut got).unwrap();
        assert_eq!(&got, b"datagram!");
        if profile == Profile::Rxe {
            assert!(r.wc_flags.contains(WcFlags::GRH));
            let mut grh = [0u8; 40];
            b.n.mr.read(0, &mut grh).unwrap();
            assert_eq!(grh[0] >> 4, 6, "IP version 6");
            assert_eq!(&grh[8..24], &a.qp.endpoint(0).gid.0, "source GID");
            assert_eq!(&grh[24..40], &b.qp.endpoint(0).gid.0, "destination GID");
        } else {
            assert!(!r.wc_flags.contains(WcFlags::GRH), "LID-routed: no GRH");
            assert_eq!(r.slid, a.qp.endpoint(0).lid);
        }
    }
}

/// One datagram from `a` to `b` through GID index `gid_index` with the AH's traffic class 0x28,
/// flow label 0x12345 and hop limit 9: the receive's 40-byte GRH area, and its completion.
fn datagram_through(a: &Ud, b: &Ud, gid_index: u32) -> ([u8; 40], Wc, Gid, Gid) {
    let sgid = a.n.ctx.device().query_gid(1, gid_index).unwrap();
    let dgid = b.n.ctx.device().query_gid(1, gid_index).unwrap();
    let attr = AhAttr {
        is_global: true,
        dgid,
        sgid_index: gid_index as u8,
        port_num: 1,
        hop_limit: 9,
        traffic_class: 0x28,
        flow_label: 0x12345,
        ..Default::default()
    };
    let ah = a.n.pd.create_ah(&attr).unwrap();
    post_recv(&b.qp, 5, &[sge(&b.n.mr, 0, 40 + 64)]);
    a.qp.post_send(&SendWr::send_ud(1, &[sge(&a.n.mr, 0, 9)], &ah, b.qp.qp_num(), QKEY)).unwrap();
    wait1(&a.n.cq);
    let wc = wait1(&b.n.cq);
    assert_eq!(wc.status, WcStatus::SUCCESS);
    let mut grh = [0u8; 40];
    b.n.mr.read(0, &mut grh).unwrap();
    (grh, wc, sgid, dgid)
}

#[test]
fn ud_over_ipv4_roce_lays_the_ipv4_header_in_the_grh_area_as_rxe() {
    // RoCE v2 over IPv4 (GID index 1): 20 zero bytes, then the packet's IPv4 header (the
    // conformance suite compares these bytes with rxe's), the TOS from the sender's AH.
    // mlx5 reports the header type in `sl` (2: IPv4); rxe reports 0.
    for (profile, sl) in [(Profile::Rxe, 0), (Profile::Full, 2)] {
        let (_f, a, b) = roce_pair(profile);
        let (grh, wc, sgid, dgid) = datagram_through(&a, &b, 1);
        assert_eq!(grh[..20], [0; 20]);
        let ip = &grh[20..];
        assert_eq!((ip[0], ip[1]), (0x45, 0x28), "IPv4, 20-byte header, TOS");
        // IP 20 + UDP 8 + BTH 12 + DETH 8 + 9 bytes + 3 pad + ICRC 4
        assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 20 + 8 + 12 + 8 + 9 + 3 + 4);
        // The kernel's route lookup replaces the AH's hop limit (9) with the route's.
        assert_eq!((ip[8], ip[9]), (64, 17), "TTL, UDP");
        assert_eq!(&ip[12..16], &sgid.0[12..], "source address");
        assert_eq!(&ip[16..20], &dgid.0[12..], "destination address");
        let mut sum: u32 = ip.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff, "header checksum");
        assert_eq!((wc.sl, wc.wc_flags.contains(WcFlags::GRH)), (sl, true), "{profile:?}");
    }
}

#[test]
fn ud_over_ipv6_roce_carries_traffic_class_flow_label_and_hop_limit() {
    // rxe sends every IPv6 packet with flow label 0; mlx5 sends the AH's and reports the
    // header type in `sl` (1: IPv6).
    for (profile, flow_label, sl) in [(Profile::Rxe, 0, 0), (Profile::Full, 0x12345, 1)] {
        let (_f, a, b) = roce_pair(profile);
        let (grh, wc, sgid, dgid) = datagram_through(&a, &b, 0);
        let word = u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]);
        assert_eq!((word >> 28, word >> 20 & 0xff, word & 0xf_ffff), (6, 0x28, flow_label));
        assert_eq!((grh[6], grh[7]), (17, 64), "UDP, the route's hop limit");
        assert_eq!((&grh[8..24], &grh[24..40]), (&sgid.0[..], &dgid.0[..]));
        assert_eq!(wc.sl, sl, "{profile:?}");
    }
}

#[test]
fn ud_checks_qkeys_and_uses_the_qps_own_when_the_high_bit_is_set() {
    let (_f, a, b) = pair(Profile::Full);
    let ah = ah_to(&a, &b);
    post_recv(&b.qp, 1, &[sge(&b.n.mr, 0, 256)]);
    a.qp.post_send(&SendWr::send_ud(1, &[sge(&a.n.mr, 0, 4)], &ah, b.qp.qp_num(), QKEY ^ 1))
        .unwrap();
    assert_eq!(wait1(&a.n.cq).status, WcStatus::SUCCESS);
    assert_empty(&b.n.cq);
    // The sender's QP Q_Key is the same as the receiver's here.
    a.qp.post_send(&SendWr::send_ud(2, &[sge(&a.n.mr, 0, 4)], &ah, b.qp.qp_num(), 0x8000_0000))
        .unwrap();
    wait1(&a.n.cq);
    assert_eq!(wait1(&b.n.cq).wr_id, 1);
}

#[test]
fn ud_drops_without_a_receive_and_limits_messages_to_the_mtu() {
    let (_f, a, b) = pair(Profile::Rxe); // active MTU 1024
    let ah = ah_to(&a, &b);
    a.qp.post_send(&SendWr::send_ud(1, &[sge(&a.n.mr, 0, 8)], &ah, b.qp.qp_num(), QKEY)).unwrap();
    assert_eq!(wait1(&a.n.cq).status, WcStatus::SUCCESS);
    assert_empty(&b.n.cq);
    a.qp.post_send(&SendWr::send_ud(2, &[sge(&a.n.mr, 0, 1025)], &ah, b.qp.qp_num(), QKEY))
        .unwrap();
    assert_eq!(wait1(&a.n.cq).status, WcStatus::LOC_LEN_ERR);
    assert_eq!(a.qp.state(), QpState::RTS, "a too-long datagram fails alone");
    post_recv(&b.qp, 9, &[sge(&b.n.mr, 0, 40 + 1024)]);
    a.qp.post_send(&SendWr::send_ud(3, &[sge(&a.n.mr, 0, 1024)], &ah, b.qp.qp_num(), QKEY))
        .unwrap();
    assert_eq!(wait1(&a.n.cq).status, WcStatus::SUCCESS);
    assert_eq!(wait1(&b.n.cq).byte_len, 40 + 1024);
}

#[test]
fn ud_too_small_receive_buffer_is_a_local_length_error() {
    let (_f, a, b) = pair(Profile::Full);
    let ah = ah_to(&a, &b);
    post_recv(&b.qp, 4, &[sge(&b.n.mr, 0, 40 + 3)]);
    a.qp.post_send(&SendWr::send_ud(1, &[sge(&a.n.mr, 0, 4)], &ah, b.qp.qp_num(), QKEY)).unwrap();
    wait1(&a.n.cq);
    let r = wait1(&b.n.cq);
    assert_eq!((r.wr_id, r.status), (4, WcStatus::LOC_LEN_ERR));
}

#[test]
fn a_datagram_to_a_connected_qp_is_dropped_for_its_transport() {
    let (_f, a, b) = common::pair(Profile::Full);
    // Its PSN is the one the RC QP expects next, so only the transport tells them apart.
    let ud = new_qp(&a.pd, &a.cq, QpType::UD, 4, true);
    use QpAttrMask as M;
    let init = QpAttr { qp_state: QpState::INIT, port_num: 1, qkey: QKEY, ..Default::default() };
    ud.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY).unwrap();
    ud.modify(&QpAttr { qp_state: QpState::RTR, ..Default::default() }, M::STATE).unwrap();
    let sq_psn = b.qp.query().unwrap().rq_psn;
    let rts = QpAttr { qp_state: QpState::RTS, sq_psn, ..Default::default() };
    ud.modify(&rts, M::STATE | M::SQ_PSN).unwrap();
    let ep = b.qp.endpoint(0);
    let attr = AhAttr { dlid: ep.lid, port_num: 1, ..Default::default() };
    let ah = a.pd.create_ah(&attr).unwrap();
    post_recv(&b.qp, 7, &[sge(&b.mr, 0, 64)]);
    ud.post_send(&SendWr::send_ud(1, &[sge(&a.mr, 0, 8)], &ah, b.qp.qp_num(), QKEY).signaled())
        .unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS, "sent");
    // The RC QP's receive is still there for its own peer's SEND.
    a.qp.post_send(&SendWr::send(2, &[sge(&a.mr, 8, 4)]).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    let r = wait1(&b.cq);
    assert_eq!((r.wr_id, r.byte_len, r.src_qp), (7, 4, 0), "the RC SEND, not the datagram");
    assert_eq!(b.qp.state(), QpState::RTS);
}

#[test]
fn an_address_handle_of_another_pd_fails_the_wr_on_rxe_and_is_sent_on_the_full_profile() {
    for profile in [Profile::Rxe, Profile::Full] {
        let (_f, a, b) = pair(profile);
        let other = a.n.ctx.alloc_pd().unwrap();
        let ah = other.create_ah(&ah_to(&a, &b).attr()).unwrap();
        post_recv(&b.qp, 5, &[sge(&b.n.mr, 0, 40 + 64)]);
        let s = [sge(&a.n.mr, 0, 8)];
        a.qp.post_send(&SendWr::send_ud(1, &s, &ah, b.qp.qp_num(), QKEY))
            .expect("the post takes it");
        let status = wait1(&a.n.cq).status;
        if profile == Profile::Rxe {
            assert_eq!(status, WcStatus::LOC_QP_OP_ERR);
            assert_eq!(a.qp.query().unwrap().qp_state, QpState::ERR);
        } else {
            assert_eq!(status, WcStatus::SUCCESS, "mlx5 copies the address into the WQE");
            assert_eq!(wait1(&b.n.cq).status, WcStatus::SUCCESS);
        }
    }
}

#[test]
fn roce_address_handles_resolve_their_destination_as_the_kernel_does() {
    let (_f, a, b) = pair(Profile::Rxe);
    let good = ah_to(&a, &b).attr();
    let gids = a.n.ctx.device().gid_table(1).unwrap();
    let v4_source = gids.iter().find(|e| e.gid.0[10] == 0xff).unwrap();
    let mut nobody = AhAttr { sgid_index: v4_source.index as u8, ..good };
    nobody.dgid.0[12..].copy_from_slice(&[203, 0, 113, 9]);
    nobody.dgid.0[..12].copy_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
    assert_eq!(a.n.pd.create_ah(&nobody).unwrap_err().errno(), Errno::ETIMEDOUT);
    let mut group = nobody;
    group.dgid.0[12] = 239;
    a.n.pd.create_ah(&group).expect("multicast needs no neighbour");
    let mixed = AhAttr { sgid_index: v4_source.index as u8, ..good };
    assert_eq!(good.dgid.0[..2], [0xfe, 0x80], "the peer's link-local GID");
    assert_eq!(a.n.pd.create_ah(&mixed).unwrap_err().errno(), Errno::EINVAL, "v4 to v6");
}

#[test]
fn ud_posting_and_address_handle_errors() {
    let (_f, a, b) = pair(Profile::Rxe);
    let s = [sge(&a.n.mr, 0, 8)];
    assert_eq!(a.qp.post_send(&SendWr::send(1, &s)).unwrap_err().errno(), Errno::EINVAL, "no AH");
    let ah = ah_to(&a, &b);
    let mut w = SendWr::send_ud(1, &s, &ah, b.qp.qp_num(), QKEY);
    w.opcode = WrOpcode::RDMA_WRITE;
    // As on rxe: the post takes it, the WR fails with a local QP operation error, QP to ERR.
    a.qp.post_send(&w).unwrap();
    assert_eq!(wait1(&a.n.cq).status, WcStatus::LOC_QP_OP_ERR, "UD carries only SEND");
    assert_eq!(a.qp.query().unwrap().qp_state, QpState::ERR);
    let no_grh = AhAttr { dlid: 1, port_num: 1, ..Default::default() };
    assert_eq!(a.n.pd.create_ah(&no_grh).unwrap_err().errno(), Errno::EINVAL, "RoCE needs a GRH");
    let bad_port = AhAttr { port_num: 2, ..ah.attr() };
    assert_eq!(a.n.pd.create_ah(&bad_port).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(a.n.pd.dealloc().unwrap_err().errno(), Errno::EBUSY, "the AH uses the PD");
    ah.destroy().unwrap();
    assert_eq!(ah.destroy().unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(
        a.qp.post_send(&SendWr::send_ud(1, &s, &ah, b.qp.qp_num(), QKEY)).unwrap_err().errno(),
        Errno::EINVAL,
        "a destroyed AH"
    );
}

#[test]
fn multicast_reaches_every_attached_qp_until_detached() {
    let (f, a, b) = pair(Profile::Full);
    let c = {
        let n = node_on(&f.devices()[0], 8192);
        let qp = ud_qp(&n, QKEY, 16);
        Ud { n, qp }
    };
    let mut mgid = Gid::ZERO;
    mgid.0[0] = 0xff;
    mgid.0[15] = 7;
    b.qp.attach_mcast(&mgid, 0xc001).unwrap();
    c.qp.attach_mcast(&mgid, 0xc001).unwrap();
    let ah =
        a.n.pd
            .create_ah(&AhAttr {
                is_global: true,
                dgid: mgid,
                dlid: 0xc001,
                port_num: 1,
                ..Default::default()
            })
            .unwrap();
    for (q, n) in [(&b.qp, &b.n), (&c.qp, &c.n)] {
        post_recv(q, 1, &[sge(&n.mr, 0, 40 + 64)]);
        post_recv(q, 2, &[sge(&n.mr, 128, 40 + 64)]);
    }
    a.n.mr.write(0, b"to all").unwrap();
    a.qp.post_send(&SendWr::send_ud(1, &[sge(&a.n.mr, 0, 6)], &ah, 0xff_ffff, QKEY)).unwrap();
    assert_eq!(wait1(&a.n.cq).status, WcStatus::SUCCESS);
    for n in [&b.n, &c.n] {
        let r = wait1(&n.cq);
        assert_eq!((r.wr_id, r.byte_len, r.src_qp), (1, 46, a.qp.qp_num()));
        assert!(r.wc_flags.contains(WcFlags::GRH));
        let mut got = [0u8; 6];
        n.mr.read(40, &mut got).unwrap();
        assert_eq!(&got, b"to all");
    }
    c.qp.detach_mcast(&mgid, 0xc001).unwrap();
    a.qp.post_send(&SendWr::send_ud(2, &[sge(&a.n.mr, 0, 6)], &ah, 0xff_ffff, QKEY)).unwrap();
    wait1(&a.n.cq);
    assert_eq!(wait1(&b.n.cq).wr_id, 2);
    assert_empty(&c.n.cq);
}

#[test]
fn multicast_attach_rules() {
    let (_f, a, b) = pair(Profile::Full);
    let mut mgid = Gid::ZERO;
    mgid.0[0] = 0xff;
    let e = |r: Result<()>| r.unwrap_err().errno();
    assert_eq!(e(a.qp.attach_mcast(&Gid::link_local(1), 0)), Errno::EINVAL, "not a multicast GID");
    assert_eq!(e(a.n.qp.attach_mcast(&mgid, 0)), Errno::EINVAL, "an RC QP");
    assert_eq!(e(a.qp.detach_mcast(&mgid, 0)), Errno::EINVAL, "not attached");
    b.qp.attach_mcast(&mgid, 0).unwrap();
    // As the kernel's uverbs (rxe, recorded): a pair already attached is taken as done, and
    // listed once (one detach undoes it).
    b.qp.attach_mcast(&mgid, 0).unwrap();
    assert_eq!(e(b.qp.detach_mcast(&mgid, 7)), Errno::EINVAL, "attached under another LID");
    assert_eq!(e(b.qp.destroy()), Errno::EBUSY, "attached QPs cannot be destroyed");
    b.qp.detach_mcast(&mgid, 0).unwrap();
    assert_eq!(e(b.qp.detach_mcast(&mgid, 0)), Errno::EINVAL, "detached already");
    b.qp.destroy().unwrap();
}

/// A group attached under two LIDs is one membership listed twice, as rxe keeps it: the
/// first detach leaves the group (no more datagrams), the second fails and unlists its pair
/// but keeps its hold on the QP, which can then no longer be destroyed (as on rxe, recorded).
#[test]
fn a_group_attached_under_two_lids_is_left_at_the_first_detach() {
    let (_f, a, b) = pair(Profile::Full);
    let mut mgid = Gid::ZERO;
    mgid.0[..2].copy_from_slice(&[0xff, 0x0e]);
    let e = |r: Result<()>| r.unwrap_err().errno();
    b.qp.attach_mcast(&mgid, 1).unwrap();
    b.qp.attach_mcast(&mgid, 2).unwrap();
    let to_group =
        AhAttr { is_global: true, dgid: mgid, dlid: 0xc001, port_num: 1, ..Default::default() };
    let ah = a.n.pd.create_ah(&to_group).unwrap();
    b.qp.post_recv(&RecvWr { wr_id: 1, sg_list: &[sge(&b.n.mr, 0, 128)] }).unwrap();
    a.qp.post_send(&SendWr::send_ud(1, &[sge(&a.n.mr, 0, 6)], &ah, 0xff_ffff, QKEY)).unwrap();
    wait1(&a.n.cq);
    assert_eq!(wait1(&b.n.cq).wr_id, 1, "one datagram for one membership");
    assert_empty(&b.n.cq);
    b.qp.detach_mcast(&mgid, 1).unwrap();
    a.qp.post_send(&SendWr::send_ud(2, &[sge(&a.n.mr, 0, 6)], &ah, 0xff_ffff, QKEY)).unwrap();
    wait1(&a.n.cq);
    assert_empty(&b.n.cq);
    assert_eq!(e(b.qp.destroy()), Errno::EBUSY, "the second pair is still listed");
    assert_eq!(e(b.qp.detach_mcast(&mgid, 2)), Errno::EINVAL, "no membership left to end");
    assert_eq!(e(b.qp.detach_mcast(&mgid, 2)), Errno::EINVAL, "unlisted");
    assert_eq!(e(b.qp.destroy()), Errno::EBUSY, "the failed detach's hold stays");
}

/// A UD request built with the `ibv_wr_*` calls but no address (`Qp::post_send_built` with
/// `ud: None`) is taken, as rxe's builder takes it, and fails as it runs: a local QP operation
/// error, the QP in ERR, what follows flushed. `ibv_post_send` refuses it at the post.
#[test]
fn a_built_datagram_without_an_address_fails_as_it_runs() {
    let (_f, a, b) = pair(Profile::Rxe);
    let s = [sge(&a.n.mr, 0, 8)];
    let bare = SendWr::send(1, &s).signaled();
    assert_eq!(a.qp.post_send(&bare).unwrap_err().errno(), Errno::EINVAL, "post_send refuses it");
    a.qp.post_send_built(&[bare]).unwrap();
    let wc = wait1(&a.n.cq);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::LOC_QP_OP_ERR));
    assert_eq!(a.qp.state(), QpState::ERR);
    let ah = ah_to(&a, &b);
    a.qp.post_send(&SendWr::send_ud(2, &s, &ah, b.qp.qp_num(), QKEY).signaled()).unwrap();
    assert_eq!(wait1(&a.n.cq).status, WcStatus::WR_FLUSH_ERR);
    assert_empty(&b.n.cq);
}
