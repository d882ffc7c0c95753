//! Raw packet QPs, flow steering, receive WQs, RSS and TSO (full profile, Ethernet ports).

mod common;

use common::{raw::*, *};
use rdma_emu::*;

fn eth_fabric() -> Fabric {
    Fabric::new(FabricConfig { link_layer: LinkLayer::ETHERNET, ..Default::default() })
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

/// This thread's effective capabilities (capabilities are per thread: tests beside it keep
/// theirs), as capget(2)/capset(2) hold them: version 3's two words.
fn effective_caps() -> ([u32; 3], [u32; 3]) {
    let mut h = [0x2008_0522u32, 0];
    let mut d = [[0u32; 3]; 2];
    // SAFETY: the header and two data structs (effective, permitted, inheritable) live across
    // the call, which writes only them.
    assert_eq!(unsafe { libc::syscall(libc::SYS_capget, h.as_mut_ptr(), d.as_mut_ptr()) }, 0);
    (d[0], d[1])
}

fn set_caps(d: ([u32; 3], [u32; 3])) {
    let mut h = [0x2008_0522u32, 0];
    let d = [d.0, d.1];
    // SAFETY: as above; capset only reads them.
    assert_eq!(unsafe { libc::syscall(libc::SYS_capset, h.as_mut_ptr(), d.as_ptr()) }, 0);
}

const CAP_NET_RAW: u32 = 13;

/// Raw packet QPs and flow rules take `CAP_NET_RAW`, as the kernel's verbs ask for it (before
/// the device sees the request: `EPERM` on the rxe profile too); a fabric made with
/// `raw_needs_cap: false` (`RDMA_EMU_NET_RAW=anyone`) lets anyone make them. Where this test
/// holds the capability (root, as in CI) it drops it from this thread's effective set and
/// raises it again.
#[test]
fn raw_packet_qps_and_flow_rules_take_cap_net_raw() {
    let saved = effective_caps();
    let held = saved.0[0] & (1 << CAP_NET_RAW) != 0;
    let (fabric, rxe) =
        (eth_fabric(), Fabric::new(FabricConfig { profile: Profile::Rxe, ..Default::default() }));
    let devs = fabric.devices();
    let a = held.then(|| raw_node(&devs[0], 0));
    if let Some(a) = &a {
        a.qp.create_flow(&mac_rule(MAC_A, 0)).unwrap();
        let mut lowered = saved;
        lowered.0[0] &= !(1 << CAP_NET_RAW);
        set_caps(lowered);
    }
    let raw = |n: &Node| n.pd.create_qp(&QpInitAttr::new(QpType::RAW_PACKET, &n.cq, cap(4)));
    for dev in [&devs[0], &rxe.devices()[0]] {
        let e = raw(&node_on(dev, 64)).unwrap_err();
        assert_eq!((e.errno(), e), (Errno::EPERM, Error::NET_RAW));
    }
    if let Some(a) = &a {
        let e = a.qp.create_flow(&mac_rule(MAC_B, 0)).unwrap_err();
        assert_eq!(e.errno(), Errno::EPERM);
        // The kernel asks for the capability before its device judges the rule.
        let vxlan = FlowAttr { specs: vec![FlowSpec::NotEmulated(0x50)], ..mac_rule(MAC_B, 0) };
        assert_eq!(a.qp.create_flow(&vxlan).unwrap_err().errno(), Errno::EPERM);
    }
    let anyone = Fabric::new(FabricConfig {
        link_layer: LinkLayer::ETHERNET,
        raw_needs_cap: false,
        ..Default::default()
    });
    let b = raw_node(&anyone.devices()[0], 0);
    b.qp.create_flow(&mac_rule(MAC_B, 0)).unwrap();
    if held {
        set_caps(saved);
        raw(&node_on(&devs[1], 64)).unwrap();
    }
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
    let vxlan = FlowAttr { specs: vec![FlowSpec::NotEmulated(0x50)], ..mac_rule(MAC_B, 0) };
    assert_eq!(e(&vxlan), Errno::EOPNOTSUPP);
    let ud = ud_qp(&r.n, 1, 4);
    assert_eq!(ud.create_flow(&mac_rule(MAC_B, 0)).unwrap_err().errno(), Errno::EOPNOTSUPP);
    assert_eq!(r.n.qp.create_flow(&mac_rule(MAC_B, 0)).unwrap_err().errno(), Errno::EINVAL);
}

#[test]
fn work_queues_follow_the_mlx5_state_rules() {
    let fabric = eth_fabric();
    let n = node_on(&fabric.devices()[0], 4096);
    let init = |max_wr| WqInitAttr::new(max_wr, 2, &n.cq);
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
    let wqs: Vec<Wq> =
        cqs.iter().map(|cq| n.pd.create_wq(&WqInitAttr::new(8, 1, cq)).unwrap()).collect();
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
    let wq = n.pd.create_wq(&WqInitAttr::new(4, 1, &n.cq)).unwrap();
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

/// `f` with an 802.1Q tag carrying `tci` after its MAC addresses.
fn tagged(f: &[u8], tci: u16) -> Vec<u8> {
    let mut t = f[..12].to_vec();
    t.extend_from_slice(&0x8100u16.to_be_bytes());
    t.extend_from_slice(&tci.to_be_bytes());
    t.extend_from_slice(&f[12..]);
    t
}

/// IEEE 802.3's CRC-32 of `f`, as the wire carries it after the frame.
fn fcs(f: &[u8]) -> [u8; 4] {
    let mut crc = !0u32;
    for &b in f {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
        }
    }
    (!crc).to_le_bytes()
}

#[test]
fn raw_qp_create_flags_strip_the_vlan_scatter_the_fcs_and_pad_the_cache_line() {
    let fabric = eth_fabric();
    let devs = fabric.devices();
    let a = raw_node(&devs[0], 0);
    let b = raw_node_with(&devs[1], 0, QpCreateFlags::CVLAN_STRIPPING | QpCreateFlags::SCATTER_FCS);
    let _flow = b.qp.create_flow(&mac_rule(MAC_B, 0)).unwrap();
    let plain = ipv4_frame(MAC_B, [10, 0, 0, 1], 1000, [10, 0, 0, 2], 80);
    let frame = tagged(&plain, 0xa064); // PCP 5, VID 100
    post_recv(&b.qp, 1, &[sge(&b.n.mr, 0, 2048)]);
    send_as_is(&a, &frame);
    let wc = b.n.cq.poll_one().expect("delivered");
    assert_eq!((wc.status, wc.cvlan), (WcStatus::SUCCESS, 0xa064));
    assert_eq!(wc.byte_len as usize, frame.len() - 4 + 4, "tag out, FCS in");
    let mut got = vec![0u8; wc.byte_len as usize];
    b.n.mr.read(0, &mut got).unwrap();
    let mut want = plain.clone();
    want.extend_from_slice(&fcs(&frame)); // the FCS of the frame as the wire carried it
    assert_eq!(got, want);
    // An untagged frame: nothing stripped, cvlan 0.
    post_recv(&b.qp, 2, &[sge(&b.n.mr, 0, 2048)]);
    send_as_is(&a, &plain);
    let wc = b.n.cq.poll_one().expect("delivered");
    assert_eq!((wc.byte_len as usize, wc.cvlan), (plain.len() + 4, 0));

    // End padding: the rest of the last 64-byte line is written with zeros, nothing beyond.
    let c = raw_node_with(&devs[1], 0, QpCreateFlags::PCI_WRITE_END_PADDING);
    let _flow = c.qp.create_flow(&mac_rule(MAC_B, 0)).unwrap();
    let len = plain.len();
    let off = (64 - (c.n.mr.addr() as usize + len) % 64 + 8) % 64; // the frame ends 8 bytes into a line
    c.n.mr.write(0, &[0xee; 512]).unwrap();
    post_recv(&c.qp, 3, &[sge(&c.n.mr, off, 256)]);
    post_recv(&b.qp, 4, &[sge(&b.n.mr, 0, 2048)]);
    send_as_is(&a, &plain);
    let wc = c.n.cq.poll_one().expect("delivered");
    assert_eq!((wc.wr_id, wc.byte_len as usize), (3, len), "the padding is not counted");
    let mut buf = vec![0u8; 512];
    c.n.mr.read(0, &mut buf).unwrap();
    assert!(buf[..off].iter().all(|&x| x == 0xee));
    assert_eq!(buf[off..off + len], plain[..]);
    assert!(buf[off + len..off + len + 56].iter().all(|&x| x == 0), "padded to the line");
    assert!(buf[off + len + 56..].iter().all(|&x| x == 0xee), "nothing past the line");
    // A receive too small for the frame and its FCS fails as any receive does.
    assert_eq!(b.n.cq.poll_one().map(|wc| wc.wr_id), Some(4), "b took its copy");
    post_recv(&b.qp, 5, &[sge(&b.n.mr, 0, len + 3)]);
    send_as_is(&a, &plain);
    assert_eq!(b.n.cq.poll_one().map(|wc| wc.status), Some(WcStatus::LOC_LEN_ERR));

    // Receive offloads are for raw packet QPs.
    let n = node_on(&devs[0], 64);
    for t in [QpType::RC, QpType::UD] {
        let init = QpInitAttr {
            create_flags: QpCreateFlags::SCATTER_FCS,
            ..QpInitAttr::new(t, &n.cq, cap(4))
        };
        assert_eq!(n.pd.create_qp(&init).unwrap_err().errno(), Errno::EOPNOTSUPP, "{t:?}");
    }
}

/// A WQ with `flags` behind a one-entry RSS QP that takes the frames sent to `MAC_B`.
fn wq_behind_rss(n: &Node, max_wr: u32, flags: WqFlags) -> (Wq, Qp, Flow) {
    let wq = n.pd.create_wq(&WqInitAttr { flags, ..WqInitAttr::new(max_wr, 1, &n.cq) }).unwrap();
    wq.modify(WqState::RDY, None).unwrap();
    let t = n.ctx.create_rwq_ind_table(0, &[&wq]).unwrap();
    let rss = n.pd.create_rss_qp(&RssConf { table: &t, function: 1, key: &[0; 40], fields: 0 });
    let rss = rss.unwrap();
    let flow = rss.create_flow(&mac_rule(MAC_B, 0)).unwrap();
    (wq, rss, flow)
}

fn post_wq(wq: &Wq, wr_id: u64, s: Sge) {
    wq.post_recv(&RecvWr { wr_id, sg_list: &[s] }).unwrap();
}

#[test]
fn wq_flags_strip_and_scatter_and_stripping_can_change() {
    let fabric = eth_fabric();
    let devs = fabric.devices();
    let a = raw_node(&devs[0], 0);
    let n = node_on(&devs[1], 4096);
    let flags = WqFlags::CVLAN_STRIPPING | WqFlags::SCATTER_FCS;
    let (wq, _rss, _flow) = wq_behind_rss(&n, 4, flags);
    assert_eq!(wq.flags(), flags);
    let frame = tagged(&ipv4_frame(MAC_B, [1, 1, 1, 1], 1, [2, 2, 2, 2], 2), 0x0007);
    post_wq(&wq, 1, sge(&n.mr, 0, 2048));
    send_as_is(&a, &frame);
    let wc = n.cq.poll_one().expect("delivered");
    assert_eq!((wc.wr_id, wc.qp_num, wc.cvlan), (1, wq.wq_num(), 7));
    assert_eq!(wc.byte_len as usize, frame.len());
    let mut got = vec![0u8; frame.len()];
    n.mr.read(0, &mut got).unwrap();
    assert_eq!(got[..12], frame[..12]);
    assert_eq!(got[12..frame.len() - 4], frame[16..], "the tag is gone");
    assert_eq!(got[frame.len() - 4..], fcs(&frame));

    // Stripping off: the frame keeps its tag.
    wq.modify_flags(WqFlags::empty(), WqFlags::CVLAN_STRIPPING).unwrap();
    assert_eq!(wq.flags(), WqFlags::SCATTER_FCS);
    post_wq(&wq, 2, sge(&n.mr, 0, 2048));
    send(&a, &frame);
    let wc = n.cq.poll_one().expect("delivered");
    assert_eq!((wc.cvlan, wc.byte_len as usize), (0, frame.len() + 4));
    // The other flags are fixed at creation.
    for f in [WqFlags::SCATTER_FCS, WqFlags::DELAY_DROP, WqFlags::PCI_WRITE_END_PADDING] {
        assert_eq!(wq.modify_flags(f, f).unwrap_err().errno(), Errno::EOPNOTSUPP, "{f:?}");
    }
    assert_eq!(wq.flags(), WqFlags::SCATTER_FCS);
}

#[test]
fn delay_drop_holds_frames_until_a_receive_comes_or_the_wait_ends() {
    // Simulation: virtual time moves only when the program waits, so the 100 ms wait of a
    // held frame ends exactly when the test lets it.
    let fabric = Fabric::new(FabricConfig {
        link_layer: LinkLayer::ETHERNET,
        seed: Some(7),
        ..Default::default()
    });
    let devs = fabric.devices();
    let a = raw_node(&devs[0], 0);
    let n = node_on(&devs[1], 8192);
    let frame = |i: u8| ipv4_frame(MAC_B, [1, 1, 1, i], 1, [2, 2, 2, 2], 2);
    let (wq, _rss, _flow) = wq_behind_rss(&n, 2, WqFlags::DELAY_DROP);
    // No receive posted: the frames wait, as many as the WQ holds (2); the third is dropped.
    for i in 1..=3 {
        send(&a, &frame(i));
    }
    for id in 1..=3 {
        post_wq(&wq, id, sge(&n.mr, id as usize * 1024, 1024));
    }
    let wcs = wait_n(&n.cq, 2);
    for (wc, i) in wcs.iter().zip(1u8..) {
        assert_eq!((wc.wr_id, wc.status), (u64::from(i), WcStatus::SUCCESS));
        let mut src = [0u8; 4];
        n.mr.read(i as usize * 1024 + 26, &mut src).unwrap();
        assert_eq!(src, [1, 1, 1, i], "frames arrive in order");
    }
    // Receive 3 is still posted: the next frame takes it at once.
    send(&a, &frame(4));
    assert_eq!(wait1(&n.cq).wr_id, 3);

    // A frame that waits out the delay is dropped (polling the empty CQ moves virtual time).
    send(&a, &frame(5));
    let before = fabric.now_ns();
    assert_empty(&n.cq);
    assert!(fabric.now_ns() - before >= 100_000_000, "the wait ran out");
    post_wq(&wq, 6, sge(&n.mr, 0, 1024));
    assert_empty(&n.cq);
    send(&a, &frame(6));
    assert_eq!(wait1(&n.cq).wr_id, 6);
    // Frames held when the WQ leaves RDY are dropped.
    send(&a, &frame(7));
    send(&a, &frame(8));
    wq.modify(WqState::RESET, None).unwrap();
    wq.modify(WqState::RDY, None).unwrap();
    post_wq(&wq, 7, sge(&n.mr, 0, 1024));
    send(&a, &frame(9));
    assert_eq!(wait1(&n.cq).wr_id, 7);
    let mut src = [0u8; 4];
    n.mr.read(26, &mut src).unwrap();
    assert_eq!(src, [1, 1, 1, 9]);

    // Without the flag a frame that finds no receive is dropped at once.
    let m = node_on(&devs[1], 4096);
    let (plain, _rss2, _flow2) = wq_behind_rss(&m, 2, WqFlags::empty());
    send(&a, &frame(10));
    post_wq(&plain, 1, sge(&m.mr, 0, 1024));
    assert_empty(&m.cq);
}

#[test]
fn a_flow_tag_rides_with_the_frames_its_rule_delivers() {
    let fabric = eth_fabric();
    let devs = fabric.devices();
    let a = raw_node(&devs[0], 0);
    let b = raw_node(&devs[1], 0);
    let tagged_rule = |tag| {
        let mut r = mac_rule(MAC_B, 0);
        r.specs.push(FlowSpec::Tag(tag));
        r
    };
    let e = |r: &FlowAttr| b.qp.create_flow(r).unwrap_err().errno();
    assert_eq!(e(&tagged_rule(1 << 24)), Errno::EINVAL, "tags are 24 bits");
    let mut two = tagged_rule(1);
    two.specs.push(FlowSpec::Tag(2));
    assert_eq!(e(&two), Errno::EINVAL, "one tag per rule");
    let _flow = b.qp.create_flow(&tagged_rule(0xab_cdef)).unwrap();
    // An RSS QP behind an untagged rule: its WQ's completions carry no tag.
    let n = node_on(&devs[1], 4096);
    let (wq, _rss, _untagged) = wq_behind_rss(&n, 2, WqFlags::empty());
    post_recv(&b.qp, 1, &[sge(&b.n.mr, 0, 2048)]);
    post_wq(&wq, 2, sge(&n.mr, 0, 2048));
    send(&a, &ipv4_frame(MAC_B, [1, 1, 1, 1], 1, [2, 2, 2, 2], 2));
    let wc = wait1(&b.n.cq);
    assert_eq!((wc.wr_id, wc.status, wc.flow_tag), (1, WcStatus::SUCCESS, 0xab_cdef));
    let wc = wait1(&n.cq);
    assert_eq!((wc.wr_id, wc.status, wc.flow_tag), (2, WcStatus::SUCCESS, 0));

    // A tagged rule in front of the WQ: the tag reaches its completions too.
    let (wq2, rss2, _f) = wq_behind_rss(&n, 2, WqFlags::empty());
    let _tagged = rss2.create_flow(&tagged_rule(7)).unwrap();
    post_wq(&wq2, 3, sge(&n.mr, 0, 2048));
    send(&a, &ipv4_frame(MAC_B, [1, 1, 1, 1], 1, [2, 2, 2, 2], 2));
    let wc = wait1(&n.cq);
    assert_eq!((wc.wr_id, wc.flow_tag), (3, 0), "the first rule to take it, untagged, wins");
    drop(_f);
    post_wq(&wq2, 4, sge(&n.mr, 0, 2048));
    send(&a, &ipv4_frame(MAC_B, [1, 1, 1, 1], 1, [2, 2, 2, 2], 2));
    let wc = wait1(&n.cq);
    assert_eq!((wc.wr_id, wc.flow_tag), (4, 7));
}
