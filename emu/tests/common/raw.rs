//! Raw packet QPs: frames to send and QPs to send and receive them.

use rdma_emu::*;

use super::*;

pub const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0xa];
pub const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0xb];

/// Ethernet + IPv4 + TCP (or UDP) with `payload`; checksums left 0 (the sender's
/// `IBV_SEND_IP_CSUM` fills them in).
pub fn ipv4_frame(dst_mac: [u8; 6], src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Vec<u8> {
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

pub struct Raw {
    pub n: Node,
    pub qp: Qp,
}

pub fn raw_node(dev: &Device, max_tso_header: u32) -> Raw {
    raw_node_with(dev, max_tso_header, QpCreateFlags::empty())
}

pub fn raw_node_with(dev: &Device, max_tso_header: u32, create_flags: QpCreateFlags) -> Raw {
    let n = node_on(dev, 1 << 16);
    let init = QpInitAttr {
        max_tso_header,
        create_flags,
        ..QpInitAttr::new(QpType::RAW_PACKET, &n.cq, cap(64))
    };
    let qp = n.pd.create_qp(&init).unwrap();
    use QpAttrMask as M;
    let init = QpAttr { qp_state: QpState::INIT, port_num: 1, ..Default::default() };
    assert_eq!(qp.modify(&init, M::STATE).unwrap_err().errno(), Errno::EINVAL, "needs PORT");
    qp.modify(&init, M::STATE | M::PORT).unwrap();
    qp.modify(&QpAttr { qp_state: QpState::RTR, ..Default::default() }, M::STATE).unwrap();
    qp.modify(&QpAttr { qp_state: QpState::RTS, ..Default::default() }, M::STATE).unwrap();
    Raw { n, qp }
}

pub fn mac_rule(mac: [u8; 6], priority: u16) -> FlowAttr {
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
pub fn send(r: &Raw, frame: &[u8]) {
    send_with(r, frame, SendFlags::IP_CSUM);
}

/// Sends `frame` from `r` as it is, byte for byte.
pub fn send_as_is(r: &Raw, frame: &[u8]) {
    send_with(r, frame, SendFlags::empty());
}

pub fn send_with(r: &Raw, frame: &[u8], flags: SendFlags) {
    r.n.mr.write(0, frame).unwrap();
    let s = [sge(&r.n.mr, 0, frame.len())];
    let wr = SendWr { send_flags: SendFlags::SIGNALED | flags, ..SendWr::send(1, &s) };
    r.qp.post_send(&wr).unwrap();
    let wc = wait1(&r.n.cq);
    assert_eq!(
        (wc.status, wc.opcode, wc.qp_num),
        (WcStatus::SUCCESS, WcOpcode::SEND, r.qp.qp_num())
    );
}
