//! Raw packet QPs, flow steering, receive WQs, RSS and TSO (full profile, Ethernet ports).

mod common;

use common::*;
use rdma_emu::*;

fn eth_fabric() -> Fabric {
    Fabric::new(FabricConfig { link_layer: LinkLayer::ETHERNET, ..Default::default() })
}

const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0xa];
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0xb];

/// Ethernet + IPv4 + TCP (or UDP) with `payload`; checksums left 0 (the sender's
/// `IBV_SEND_IP_CSUM` fills them in).
fn ipv4_frame(dst_mac: [u8; 6], src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Vec<u8> {
    let payload = b"rdma-emu raw frame";
    let mut f = Vec::new();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&MAC_A);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let total = (20 + 20 + payload.len()) as u16;
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x40, 0, 64, 6, 0, 0]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
    f.extend_from_slice(payload);
    f
}

struct Raw {
    n: Node,
    qp: Qp,
}

fn raw_node(dev: &Device, max_tso_header: u32) -> Raw {
    let n = node_on(dev, 1 << 16);
    let init = QpInitAttr { max_tso_header, ..QpInitAttr::new(QpType::RAW_PACKET, &n.cq, cap(64)) };
    let qp = n.pd.create_qp(&init).unwrap();
    use QpAttrMask as M;
    let init = QpAttr { qp_state: QpState::INIT, port_num: 1, ..Default::default() };
    assert_eq!(qp.modify(&init, M::STATE).unwrap_err().errno(), Errno::EINVAL, "needs PORT");
    qp.modify(&init, M::STATE | M::PORT).unwrap();
    qp.modify(&QpAttr { qp_state: QpState::RTR, ..Default::default() }, M::STATE).unwrap();
    qp.modify(&QpAttr { qp_state: QpState::RTS, ..Default::default() }, M::STATE).unwrap();
    Raw { n, qp }
}

fn mac_rule(mac: [u8; 6], priority: u16) -> FlowAttr {
    let val = EthFilter { dst_mac: mac, ..Default::default() };
    let mask = EthFilter { dst_mac: [0xff; 6], ..Default::default() };
    FlowAttr {
        flow_type: FlowType::NORMAL,
        priority,
        port: 1,
        flags: 0,
        specs: vec![FlowSpec::Eth { val, mask }],
    }
}

/// Sends `frame` from `r` (checksums filled in by the NIC) and waits for its completion.
fn send(r: &Raw, frame: &[u8]) {
    r.n.mr.write(0, frame).unwrap();
    let s = [sge(&r.n.mr, 0, frame.len())];
    let wr = SendWr { send_flags: SendFlags::SIGNALED | SendFlags::IP_CSUM, ..SendWr::send(1, &s) };
    r.qp.post_send(&wr).unwrap();
    let wc = wait1(&r.n.cq);
    assert_eq!(
        (wc.status, wc.opcode, wc.qp_num),
        (WcStatus::SUCCESS, WcOpcode::SEND, r.qp.qp_num())
    );
}

#[test]
fn raw_packet_qps_need_the_full_profile_on_ethernet() {
    for fabric in [
        Fabric::new(FabricConfig::default()),
        Fabric::new(FabricConfig { profile: Profile::Rxe, ..Default::default() }),
    ] {
        let n = node_on(&fabric.devices()[0], 64);
        let e = n.pd.create_qp(&QpInitAttr::new(QpType::RAW_PACKET, &n.cq, cap(4))).unwrap_err();
        assert_eq!(e.errno(), Errno::EOPNOTSUPP);
    }
    let fabric = eth_fabric();
    let dev = &fabric.devices()[0];
    let p = dev.query_port(1).unwrap();
    assert_eq!((p.link_layer, p.lid), (LinkLayer::ETHERNET, 0));
    let n = node_on(dev, 64);
    // TSO headers only on raw packet QPs.
    let init = QpInitAttr { max_tso_header: 64, ..QpInitAttr::new(QpType::UD, &n.cq, cap(4)) };
    assert_eq!(n.pd.create_qp(&init).unwrap_err().errno(), Errno::EINVAL);
}

#[test]
fn frames_reach_the_qps_whose_flows_match_them_whole() {
    let fabric = eth_fabric();
    let devs = fabric.devices();
    let a = raw_node(&devs[0], 0);
    let b = raw_node(&devs[1], 0);
    let flow = b.qp.create_flow(&mac_rule(MAC_B, 0)).unwrap();
    let frame = ipv4_frame(MAC_B, [10, 0, 0, 1], 1000, [10, 0, 0, 2], 80);
    post_recv(&b.qp, 7, &[sge(&b.n.mr, 0, 2048)]);
    send(&a, &frame);
    let wc = wait1(&b.n.cq);
    assert_eq!((wc.wr_id, wc.status, wc.opcode), (7, WcStatus::SUCCESS, WcOpcode::RECV));
    assert_eq!(wc.byte_len as usize, frame.len());
    assert!(wc.wc_flags.contains(WcFlags::IP_CSUM_OK), "the NIC filled in valid checksums");
    let mut got = vec![0u8; frame.len()];
    b.n.mr.read(0, &mut got).unwrap();
    assert_eq!(got[..24], frame[..24], "headers arrive as sent");
    assert_ne!(got[24..26], [0, 0], "IPv4 header checksum inserted");
    assert_eq!(got[54..], frame[54..]);

    // Another MAC: no rule takes it, it is dropped; the receive stays posted.
    post_recv(&b.qp, 8, &[sge(&b.n.mr, 0, 2048)]);
    send(&a, &ipv4_frame(MAC_A, [10, 0, 0, 1], 1000, [10, 0, 0, 2], 80));
    assert_empty(&b.n.cq);
    // A frame shorter than an Ethernet header with a VLAN tag is refused at the post.
    let s = [sge(&a.n.mr, 0, 17)];
    assert_eq!(a.qp.post_send(&SendWr::send(2, &s)).unwrap_err().errno(), Errno::EINVAL);

    // The QP cannot go while a flow steers to it; once the flow is gone frames stop.
    assert_eq!(b.qp.destroy().unwrap_err().errno(), Errno::EBUSY);
    flow.destroy().unwrap();
    assert_eq!(flow.destroy().unwrap_err().errno(), Errno::EINVAL);
    send(&a, &frame);
    assert_empty(&b.n.cq);
    b.qp.destroy().unwrap();
}

#[test]
fn steering_honours_priority_dont_trap_defaults_and_sniffers() {
    let fabric = eth_fabric();
    let devs = fabric.devices();
    let a = raw_node(&devs[0], 0);
    let [hi, lo, dflt, sniff] = std::array::from_fn(|_| raw_node(&devs[1], 0));
    for r in [&hi, &lo, &dflt, &sniff] {
        for i in 0..4 {
            post_recv(&r.qp, i, &[sge(&r.n.mr, 0, 2048)]);
        }
    }
    let f_hi = hi.qp.create_flow(&mac_rule(MAC_B, 1)).unwrap();
    let _f_lo = lo.qp.create_flow(&mac_rule(MAC_B, 2)).unwrap();
    let all = FlowAttr { flow_type: FlowType::ALL_DEFAULT, ..mac_rule(MAC_B, 0) };
    let _f_d = dflt.qp.create_flow(&FlowAttr { specs: vec![], ..all.clone() }).unwrap();
    let sn = FlowAttr { flow_type: FlowType::SNIFFER, specs: vec![], ..all };
    let _f_s = sniff.qp.create_flow(&sn).unwrap();
    let count = |r: &Raw| std::iter::from_fn(|| r.n.cq.poll_one()).count();

    // The better priority traps the frame; the sniffer sees it too.
    send(&a, &ipv4_frame(MAC_B, [1, 1, 1, 1], 1, [2, 2, 2, 2], 2));
    assert_eq!([count(&hi), count(&lo), count(&dflt), count(&sniff)], [1, 0, 0, 1]);
    // Unmatched: the default rule takes it.
    send(&a, &ipv4_frame(MAC_A, [1, 1, 1, 1], 1, [2, 2, 2, 2], 2));
    assert_eq!([count(&hi), count(&lo), count(&dflt), count(&sniff)], [0, 0, 1, 1]);
    // DONT_TRAP lets the lower priority have it as well.
    f_hi.destroy().unwrap();
    let _f_hi2 = hi.qp.create_flow(&FlowAttr { flags: 1 << 1, ..mac_rule(MAC_B, 1) }).unwrap();
    send(&a, &ipv4_frame(MAC_B, [1, 1, 1, 1], 1, [2, 2, 2, 2], 2));
    assert_eq!([count(&hi), count(&lo), count(&dflt), count(&sniff)], [1, 1, 0, 1]);
}

#[test]
fn flow_rules_out_of_range_are_refused_as_mlx5_refuses_them() {
    let fabric = eth_fabric();
    let r = raw_node(&fabric.devices()[0], 0);
    let e = |a: &FlowAttr| r.qp.create_flow(a).unwrap_err().errno();
    assert_eq!(e(&mac_rule(MAC_B, 16)), Errno::ENOMEM);
    assert_eq!(e(&FlowAttr { port: 2, ..mac_rule(MAC_B, 0) }), Errno::EINVAL);
    assert_eq!(e(&FlowAttr { flags: 1 << 2, ..mac_rule(MAC_B, 0) }), Errno::EOPNOTSUPP);
    assert_eq!(e(&FlowAttr { flags: 1 << 5, ..mac_rule(MAC_B, 0) }), Errno::EINVAL);
    let val = PortFilter { dst_port: 0x1ff, src_port: 0 };
    let mask = PortFilter { dst_port: 0xff, src_port: 0 };
    let bad = FlowAttr { specs: vec![FlowSpec::Tcp { val, mask }], ..mac_rule(MAC_B, 0) };
    assert_eq!(e(&bad), Errno::EINVAL, "value bits outside the mask");
    let ud = ud_qp(&r.n, 1, 4);
    assert_eq!(ud.create_flow(&mac_rule(MAC_B, 0)).unwrap_err().errno(), Errno::EOPNOTSUPP);
    assert_eq!(r.n.qp.create_flow(&mac_rule(MAC_B, 0)).unwrap_err().errno(), Errno::EINVAL);
}

#[test]
fn work_queues_follow_the_mlx5_state_rules() {
    let fabric = eth_fabric();
    let n = node_on(&fabric.devices()[0], 4096);
    let init = |max_wr| WqInitAttr { max_wr, max_sge: 2, cq: &n.cq };
    assert_eq!(n.pd.create_wq(&init(0)).unwrap_err().errno(), Errno::EINVAL);
    let wq = n.pd.create_wq(&init(5)).unwrap();
    assert_eq!((wq.state(), wq.max_wr(), wq.max_sge()), (WqState::RESET, 5, 2));
    let s = [sge(&n.mr, 0, 64)];
    let too_many = [s[0]; 3];
    assert_eq!(
        wq.post_recv(&RecvWr { wr_id: 9, sg_list: &too_many }).unwrap_err().errno(),
        Errno::EINVAL
    );
    // Posted in RESET: lost when the WQ becomes ready.
    wq.post_recv(&RecvWr { wr_id: 1, sg_list: &s }).unwrap();
    assert_eq!(wq.modify(WqState::ERR, None).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(wq.modify(WqState::RDY, Some(WqState::RDY)).unwrap_err().errno(), Errno::EINVAL);
    wq.modify(WqState::RDY, Some(WqState::RESET)).unwrap();
    wq.post_recv(&RecvWr { wr_id: 2, sg_list: &s }).unwrap();
    wq.post_recv(&RecvWr { wr_id: 3, sg_list: &s }).unwrap();
    wq.modify(WqState::ERR, None).unwrap();
    let flushed = wait_n(&n.cq, 2);
    for (wc, id) in flushed.iter().zip([2, 3]) {
        assert_eq!((wc.wr_id, wc.status, wc.qp_num), (id, WcStatus::WR_FLUSH_ERR, wq.wq_num()));
    }
    // Posted in ERR: flushed at once.
    wq.post_recv(&RecvWr { wr_id: 4, sg_list: &s }).unwrap();
    assert_eq!(wait1(&n.cq).wr_id, 4);
    assert_eq!(wq.modify(WqState::RDY, None).unwrap_err().errno(), Errno::EINVAL);
    wq.modify(WqState::RESET, None).unwrap();
    assert_empty(&n.cq);

    // In a table it cannot go; the table cannot go under an RSS QP.
    let t = n.ctx.create_rwq_ind_table(0, &[&wq]).unwrap();
    assert_eq!(n.ctx.create_rwq_ind_table(1, &[&wq]).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(wq.destroy().unwrap_err().errno(), Errno::EBUSY);
    let key = [7u8; 40];
    let conf = RssConf { table: &t, function: 1, key: &key, fields: 0 };
    let rss = n.pd.create_rss_qp(&conf).unwrap();
    assert_eq!(t.destroy().unwrap_err().errno(), Errno::EBUSY);
    assert_eq!(rss.query().unwrap_err().errno(), Errno::EOPNOTSUPP);
    assert_eq!(
        rss.post_recv(&RecvWr { wr_id: 1, sg_list: &s }).unwrap_err().errno(),
        Errno::EINVAL
    );
    rss.destroy().unwrap();
    t.destroy().unwrap();
    wq.destroy().unwrap();
}

#[test]
fn rss_spreads_frames_over_the_wqs_by_the_toeplitz_hash() {
    // Microsoft's RSS verification key and suite: (source, port, destination, port, IPv4 +
    // TCP hash).
    const KEY: [u8; 40] = [
        0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f,
        0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30,
        0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
    ];
    type Case = ([u8; 4], u16, [u8; 4], u16, u32);
    let cases: [Case; 5] = [
        ([66, 9, 149, 187], 2794, [161, 142, 100, 80], 1766, 0x51cc_c178),
        ([199, 92, 111, 2], 14230, [65, 69, 140, 83], 4739, 0xc626_b0ea),
        ([24, 19, 198, 95], 12898, [12, 22, 207, 184], 38024, 0x5c2b_394a),
        ([38, 27, 205, 30], 48228, [209, 142, 163, 6], 2217, 0xafc7_327f),
        ([153, 39, 163, 191], 44251, [202, 188, 127, 2], 1303, 0x10e8_28a2),
    ];
    let fabric = eth_fabric();
    let devs = fabric.devices();
    let a = raw_node(&devs[0], 0);
    let n = node_on(&devs[1], 1 << 16);
    let cqs: Vec<Cq> = (0..4).map(|_| n.ctx.create_cq(16, None, 0).unwrap()).collect();
    let wqs: Vec<Wq> = cqs
        .iter()
        .map(|cq| n.pd.create_wq(&WqInitAttr { max_wr: 8, max_sge: 1, cq }).unwrap())
        .collect();
    for (i, wq) in wqs.iter().enumerate() {
        wq.modify(WqState::RDY, None).unwrap();
        for k in 0..4 {
            let s = [sge(&n.mr, (i * 4 + k) * 256, 256)];
            wq.post_recv(&RecvWr { wr_id: (i * 4 + k) as u64, sg_list: &s }).unwrap();
        }
    }
    let refs: Vec<&Wq> = wqs.iter().collect();
    let t = n.ctx.create_rwq_ind_table(2, &refs).unwrap();
    let e = |conf: RssConf<'_>| n.pd.create_rss_qp(&conf).unwrap_err().errno();
    let conf = RssConf { table: &t, function: 1, key: &KEY, fields: 0x3 | 0x30 };
    assert_eq!(e(RssConf { key: &KEY[..39], ..conf }), Errno::EINVAL);
    assert_eq!(e(RssConf { function: 2, ..conf }), Errno::EOPNOTSUPP);
    assert_eq!(e(RssConf { fields: 0x1 | 0x4, ..conf }), Errno::EINVAL, "IPv4 and IPv6");
    assert_eq!(e(RssConf { fields: 0x3 | 0x10 | 0x40, ..conf }), Errno::EINVAL, "TCP and UDP");
    assert_eq!(e(RssConf { fields: 0, ..conf }), Errno::EINVAL, "no field, 4 entries");
    assert_eq!(e(RssConf { fields: 1 << 8, ..conf }), Errno::EOPNOTSUPP);
    let rss = n.pd.create_rss_qp(&conf).unwrap();
    let _flow = rss.create_flow(&mac_rule(MAC_B, 0)).unwrap();
    for (src, sport, dst, dport, hash) in cases {
        send(&a, &ipv4_frame(MAC_B, src, sport, dst, dport));
        let i = (hash & 3) as usize;
        let wc = wait1(&cqs[i]);
        assert_eq!((wc.status, wc.qp_num), (WcStatus::SUCCESS, wqs[i].wq_num()), "{src:?}");
        for (j, cq) in cqs.iter().enumerate() {
            assert!(j == i || cq.poll_one().is_none(), "{src:?} also reached WQ {j}");
        }
    }
}

#[test]
fn a_receive_too_small_fails_the_wq_with_wq_fatal() {
    let fabric = eth_fabric();
    let devs = fabric.devices();
    let a = raw_node(&devs[0], 0);
    let n = node_on(&devs[1], 4096);
    let wq = n.pd.create_wq(&WqInitAttr { max_wr: 4, max_sge: 1, cq: &n.cq }).unwrap();
    wq.modify(WqState::RDY, None).unwrap();
    for (id, len) in [(1, 16), (2, 2048)] {
        wq.post_recv(&RecvWr { wr_id: id, sg_list: &[sge(&n.mr, 0, len)] }).unwrap();
    }
    let t = n.ctx.create_rwq_ind_table(0, &[&wq]).unwrap();
    let rss = n.pd.create_rss_qp(&RssConf { table: &t, function: 1, key: &[0; 40], fields: 0 });
    let rss = rss.unwrap();
    let _flow = rss.create_flow(&mac_rule(MAC_B, 0)).unwrap();
    send(&a, &ipv4_frame(MAC_B, [1, 1, 1, 1], 1, [2, 2, 2, 2], 2));
    let wcs = wait_n(&n.cq, 2);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::LOC_LEN_ERR));
    assert_eq!((wcs[1].wr_id, wcs[1].status), (2, WcStatus::WR_FLUSH_ERR));
    assert_eq!(wq.state(), WqState::ERR);
    let ev = n.ctx.get_async_event().unwrap();
    assert_eq!(ev.event_type, EventType::WQ_FATAL);
    assert!(matches!(&ev.element, EventElement::Wq(w) if w.same(&wq)));
    n.ctx.ack_async_event(&ev);
}

#[test]
fn tso_cuts_one_send_into_mss_segments() {
    let fabric = eth_fabric();
    let devs = fabric.devices();
    let a = raw_node(&devs[0], 64);
    let b = raw_node(&devs[1], 0);
    let _flow = b.qp.create_flow(&mac_rule(MAC_B, 0)).unwrap();
    for i in 0..4 {
        post_recv(&b.qp, i, &[sge(&b.n.mr, i as usize * 2048, 2048)]);
    }
    let frame = ipv4_frame(MAC_B, [10, 0, 0, 1], 1000, [10, 0, 0, 2], 80);
    let hdr = &frame[..54];
    let payload: Vec<u8> = (0..2500u32).map(|i| (i % 251) as u8).collect();
    a.n.mr.write(0, &payload).unwrap();
    let s = [sge(&a.n.mr, 0, payload.len())];
    let wr = SendWr { send_flags: SendFlags::SIGNALED, ..SendWr::tso(5, &s, hdr, 1000) };
    a.qp.post_send(&wr).unwrap();
    let wc = wait1(&a.n.cq);
    assert_eq!((wc.wr_id, wc.status, wc.opcode), (5, WcStatus::SUCCESS, WcOpcode::TSO));
    let wcs = wait_n(&b.n.cq, 3);
    for (i, wc) in wcs.iter().enumerate() {
        let len = 54 + (2500 - i * 1000).min(1000);
        assert_eq!((wc.status, wc.byte_len as usize), (WcStatus::SUCCESS, len));
        assert!(wc.wc_flags.contains(WcFlags::IP_CSUM_OK), "segment {i} checksums");
        let mut got = vec![0u8; len];
        b.n.mr.read(i * 2048, &mut got).unwrap();
        assert_eq!(u32::from_be_bytes(got[38..42].try_into().unwrap()), i as u32 * 1000, "seq");
        assert_eq!(got[54..], payload[i * 1000..i * 1000 + len - 54]);
    }
    // A header longer than max_tso_header, or TSO on a QP without it, is refused.
    let long = [0u8; 65];
    assert_eq!(
        a.qp.post_send(&SendWr::tso(6, &s, &long, 1000)).unwrap_err().errno(),
        Errno::EINVAL
    );
    assert_eq!(b.qp.post_send(&SendWr::tso(6, &s, hdr, 1000)).unwrap_err().errno(), Errno::EINVAL);
}
