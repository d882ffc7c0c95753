//! The express path against the packet path: random programs of SENDs (with and without
//! immediate, inline), WRITEs, READs and atomics on RC QPs with their own receive queues, RC
//! QPs on SRQs and UC QPs, and datagrams between UD QPs (global address handles or not, good,
//! wrong and the sender's own Q_Keys, to another QP or to the sender itself), with good keys,
//! bad keys and keys without the access, ranges that run past their MR, receives too short or
//! missing, QPs moved to ERR and reconnected, run once with the express path and once without.
//! On the full profile (rxe has no XRC) an XRC initiator sends to a target QP too, naming
//! one of two XRC SRQs (one on another PD, whose MR alone its requests reach) or none. Every
//! completion (all fields), every QP's state and PSNs after every step, and the final memory
//! must be identical.

mod common;
use common::*;
use proptest::prelude::*;
use rdma_emu::*;

const MEM: usize = 1024;
/// Pair 0: RC with receive queues; pair 1: RC on SRQs; pair 2: UC.
const PAIRS: usize = 3;
/// The UD QPs' "pair" (one UD QP on each side, side 1's on its SRQ) in `Op::Error` and
/// `Op::Reconnect`.
const UD: usize = PAIRS;
/// The XRC "pair" (side 0's initiator, side 1's target QP): its requests go from side 0 to
/// side 1 whatever their `dir`, which names the XRC SRQ instead (`xsrq`); a receive's `side`
/// names the XRC SRQ it is posted to.
const XRC: usize = PAIRS + 1;
/// Both UD QPs' Q_Key.
const QKEY: u32 = 0x0bad_cafe;

/// The Q_Key a datagram carries.
#[derive(Debug, Clone, Copy)]
enum Qkey {
    /// The receiver's.
    Good,
    /// Another.
    Bad,
    /// High bit set: the sender's own (IBA 10.2.5).
    Own,
}

#[derive(Debug, Clone, Copy)]
enum Key {
    Good,
    /// An rkey that names nothing.
    Bad,
    /// The rkey of an MR without remote write or atomic access.
    ReadOnly,
}

#[derive(Debug, Clone)]
enum Op {
    Recv {
        pair: usize,
        side: usize,
        off: usize,
        len: usize,
    },
    /// `recv`: a receive for it is posted first (it may be missing, or too short).
    Send {
        pair: usize,
        dir: usize,
        src: usize,
        len: usize,
        imm: Option<u32>,
        inline: bool,
        recv: bool,
    },
    Write {
        pair: usize,
        dir: usize,
        src: usize,
        dst: usize,
        len: usize,
        imm: Option<u32>,
        key: Key,
        recv: bool,
    },
    Read {
        pair: usize,
        dir: usize,
        src: usize,
        dst: usize,
        len: usize,
        key: Key,
    },
    Atomic {
        pair: usize,
        dir: usize,
        off: usize,
        res: usize,
        cswp: bool,
        value: u64,
        key: Key,
    },
    /// A receive for side `side`'s UD QP (its GRH area included in `len`).
    UdRecv {
        side: usize,
        off: usize,
        len: usize,
    },
    /// A datagram from side `dir`'s UD QP to the other's (or to itself: `loopback`), through
    /// a global address handle or not; `recv`: a receive for it is posted first. `write`: the
    /// request is an RDMA WRITE instead, which UD does not carry.
    UdSend {
        write: bool,
        dir: usize,
        src: usize,
        len: usize,
        imm: Option<u32>,
        inline: bool,
        qkey: Qkey,
        global: bool,
        loopback: bool,
        recv: bool,
    },
    Error {
        pair: usize,
        side: usize,
    },
    Reconnect {
        pair: usize,
    },
}

fn key() -> impl Strategy<Value = Key> {
    prop_oneof![30 => Just(Key::Good), 1 => Just(Key::Bad), 1 => Just(Key::ReadOnly)]
}

fn op() -> impl Strategy<Value = Op> {
    let pair = prop_oneof![4 => 0..PAIRS, 1 => Just(XRC)];
    // UC carries no READ or atomics: those fail its QPs, and mostly go to RC (or XRC).
    let rc_pair = prop_oneof![10 => 0..2usize, 1 => Just(2usize), 3 => Just(XRC)];
    let recv = prop::bool::weighted(0.9);
    let dir = 0..2usize;
    // Offsets and lengths may run past the end of the MR or the receive buffer (those must
    // fail), mostly not.
    let off = prop_oneof![8 => 0..MEM - 300, 1 => 0..MEM];
    let len = prop_oneof![8 => 0usize..100, 1 => 100usize..300];
    let imm = proptest::option::of(any::<u32>());
    prop_oneof![
        6 => (pair.clone(), dir.clone(), off.clone(), len.clone())
            .prop_map(|(pair, side, off, len)| Op::Recv { pair, side, off, len: len + 200 }),
        4 => (pair.clone(), dir.clone(), off.clone(), len.clone(), imm.clone(), any::<bool>(), recv)
            .prop_map(|(pair, dir, src, len, imm, inline, recv)| Op::Send { pair, dir, src, len, imm, inline, recv }),
        4 => (pair.clone(), dir.clone(), off.clone(), off.clone(), len.clone(), imm.clone(), key(), recv)
            .prop_map(|(pair, dir, src, dst, len, imm, key, recv)| Op::Write { pair, dir, src, dst, len, imm, key, recv }),
        3 => (rc_pair.clone(), dir.clone(), off.clone(), off.clone(), len.clone(), key())
            .prop_map(|(pair, dir, src, dst, len, key)| Op::Read { pair, dir, src, dst, len, key }),
        3 => (rc_pair, dir.clone(), off.clone(), off.clone(), any::<bool>(), any::<u64>(), key())
            .prop_map(|(pair, dir, off, res, cswp, value, key)| Op::Atomic { pair, dir, off, res, cswp, value, key }),
        3 => (dir.clone(), off.clone(), 0usize..360)
            .prop_map(|(side, off, len)| Op::UdRecv { side, off, len }),
        4 => (dir.clone(), off, len, imm, any::<bool>(), ud_qkey(), any::<(bool, bool, bool)>(), prop::bool::weighted(0.1))
            .prop_map(|(dir, src, len, imm, inline, qkey, (global, loopback, recv), write)| {
                Op::UdSend { write, dir, src, len, imm, inline, qkey, global, loopback: loopback && !recv, recv }
            }),
        1 => (0..XRC + 1, dir).prop_map(|(pair, side)| Op::Error { pair, side }),
        2 => (0..XRC + 1).prop_map(|pair| Op::Reconnect { pair }),
    ]
}

fn ud_qkey() -> impl Strategy<Value = Qkey> {
    prop_oneof![6 => Just(Qkey::Good), 1 => Just(Qkey::Bad), 2 => Just(Qkey::Own)]
}

/// Takes a UD QP to RTS with [`QKEY`].
fn ud_ready(qp: &Qp) {
    use QpAttrMask as M;
    let init = QpAttr { qp_state: QpState::INIT, port_num: 1, qkey: QKEY, ..Default::default() };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY).unwrap();
    qp.modify(&QpAttr { qp_state: QpState::RTR, ..Default::default() }, M::STATE).unwrap();
    let rts = QpAttr { qp_state: QpState::RTS, sq_psn: 11, ..Default::default() };
    qp.modify(&rts, M::STATE | M::SQ_PSN).unwrap();
}

struct World {
    _fabric: Fabric,
    mr: [Mr; 2],
    ro: [Mr; 2],
    cq: [Cq; 2],
    srq: [Srq; 2],
    qps: Vec<[Qp; 2]>,
    ud: [Qp; 2],
    /// The full profile's XRC objects (rxe has no XRC).
    xrc: Option<Xrc>,
    /// `ah[from][global]`: an address handle on side `from`'s PD to the other side's port, and
    /// one to its own port.
    ah: [[Ah; 2]; 2],
    own_ah: [[Ah; 2]; 2],
}

/// An XRC initiator on side 0 connected to a target QP on side 1, whose domain has two XRC
/// SRQs: one on side 1's PD, one on another PD, whose MR (`mr`) alone its requests reach and
/// its receives take.
struct Xrc {
    ini: Qp,
    tgt: Qp,
    srq: [Srq; 2],
    mr: Mr,
    _domain: (Xrcd, Pd),
}

impl Xrc {
    fn srqn(&self, which: usize) -> u32 {
        self.srq[which].srq_num().unwrap()
    }

    /// The MR the requests to XRC SRQ `which` reach with `key`.
    fn rkey(&self, w: &World, which: usize, key: Key) -> (u64, u32) {
        match (which, key) {
            (1, Key::Good) => (self.mr.addr(), self.mr.rkey()),
            (1, Key::Bad) => (self.mr.addr(), self.mr.rkey() ^ 0x300),
            // (Side 1's MR for the other PD's SRQ: refused.)
            _ => w.rkey(1, key),
        }
    }
}

fn params() -> RcParams {
    // No RNR retries and no retransmission timer: every outcome is decided within the verb
    // that started it, so the two runs can be compared step by step.
    RcParams { rnr_retry: 0, timeout: 0, ..RcParams::default() }
}

impl World {
    fn new(profile: Profile, express: bool) -> World {
        let fabric =
            Fabric::new(FabricConfig { devices: 2, profile, express, ..Default::default() });
        let devs = fabric.devices();
        let ctx: Vec<Context> = devs.iter().map(|d| d.open().unwrap()).collect();
        let pd: Vec<Pd> = ctx.iter().map(|c| c.alloc_pd().unwrap()).collect();
        let cq: Vec<Cq> = ctx.iter().map(|c| c.create_cq(1024, None, 0).unwrap()).collect();
        let mr: Vec<Mr> = pd.iter().map(|p| p.reg_mr(MEM, ALL_ACCESS).unwrap()).collect();
        let ro_access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
        let ro: Vec<Mr> = pd.iter().map(|p| p.reg_mr(MEM, ro_access).unwrap()).collect();
        let srq_attr = SrqAttr { max_wr: 64, max_sge: 2, srq_limit: 0 };
        let srq: Vec<Srq> = pd.iter().map(|p| p.create_srq(&srq_attr).unwrap()).collect();
        let mut qps = Vec::new();
        for pair in 0..PAIRS {
            let mk = |s: usize| {
                let ty = if pair == 2 { QpType::UC } else { QpType::RC };
                let mut attr = QpInitAttr::new(ty, &cq[s], cap(32));
                attr.sq_sig_all = true;
                if pair == 1 {
                    attr.srq = Some(&srq[s]);
                }
                pd[s].create_qp(&attr).unwrap()
            };
            let qp = [mk(0), mk(1)];
            connect(&qp[0], &qp[1], &params(), &params());
            qps.push(qp);
        }
        let ud: Vec<Qp> = (0..2)
            .map(|s| {
                let mut attr = QpInitAttr::new(QpType::UD, &cq[s], cap(32));
                attr.sq_sig_all = true;
                // Side 1's takes its receives from the SRQ its RC QPs of pair 1 share.
                if s == 1 {
                    attr.srq = Some(&srq[s]);
                }
                let qp = pd[s].create_qp(&attr).unwrap();
                ud_ready(&qp);
                qp
            })
            .collect();
        let ah_to = |from: usize, to: usize, global: bool| {
            let port = ctx[to].query_port(1).unwrap();
            let ep = ud[to].endpoint(0);
            // A RoCE port takes global address handles only.
            let is_global = global || port.link_layer == LinkLayer::ETHERNET;
            let attr = AhAttr {
                is_global,
                dgid: ep.gid,
                dlid: ep.lid,
                port_num: 1,
                hop_limit: 64,
                traffic_class: 0x20,
                ..Default::default()
            };
            pd[from].create_ah(&attr).unwrap()
        };
        let ahs = |to: fn(usize) -> usize| {
            [0, 1].map(|from| [false, true].map(|global| ah_to(from, to(from), global)))
        };
        let (ah, own_ah) = (ahs(|from| 1 - from), ahs(|from| from));
        let xrc = (profile == Profile::Full).then(|| {
            let domain =
                (ctx[1].open_xrcd(None, xrcd_oflags::CREAT).unwrap(), ctx[1].alloc_pd().unwrap());
            let srq_attr = SrqAttr { max_wr: 64, max_sge: 2, srq_limit: 0 };
            let srq =
                [&pd[1], &domain.1].map(|p| domain.0.create_srq(p, &cq[1], &srq_attr).unwrap());
            let mr = domain.1.reg_mr(MEM, ALL_ACCESS).unwrap();
            let fill: Vec<u8> = (0..MEM).map(|i| (i * 17 + 3) as u8).collect();
            mr.write(0, &fill).unwrap();
            let mut attr = QpInitAttr::new(QpType::XRC_SEND, &cq[0], cap(32));
            attr.sq_sig_all = true;
            let ini = pd[0].create_qp(&attr).unwrap();
            let tgt = domain.0.create_recv_qp().unwrap();
            connect(&ini, &tgt, &params(), &params());
            Xrc { ini, tgt, srq, mr, _domain: domain }
        });
        for (s, m) in mr.iter().chain(&ro).enumerate() {
            let fill: Vec<u8> = (0..MEM).map(|i| (i * 31 + s * 7) as u8).collect();
            m.write(0, &fill).unwrap();
        }
        World {
            _fabric: fabric,
            mr: mr.try_into().unwrap(),
            ro: ro.try_into().unwrap(),
            cq: cq.try_into().unwrap(),
            srq: srq.try_into().unwrap(),
            qps,
            ud: ud.try_into().unwrap(),
            xrc,
            ah,
            own_ah,
        }
    }

    fn rkey(&self, side: usize, key: Key) -> (u64, u32) {
        match key {
            Key::Good => (self.mr[side].addr(), self.mr[side].rkey()),
            Key::Bad => (self.mr[side].addr(), self.mr[side].rkey() ^ 0x300),
            Key::ReadOnly => (self.ro[side].addr(), self.ro[side].rkey()),
        }
    }

    /// Runs `op` on the XRC QPs (see [`XRC`]); nothing on rxe.
    fn run_xrc(&self, op: &Op) -> Vec<String> {
        let Some(x) = &self.xrc else { return Vec::new() };
        let payload: Vec<u8> = (0..300u32).map(|i| (i * 13) as u8).collect();
        let mut posted = Vec::new();
        // Now and then a request names no SRQ of the domain (the target NAKs it).
        let srqn = |which: usize, salt: usize| if salt % 17 == 5 { 0xdead } else { x.srqn(which) };
        let mem = |which: usize| if which == 1 { &x.mr } else { &self.mr[1] };
        let post = |what: &str, wr: SendWr<'_>| {
            format!("xrc {what} {:?}", x.ini.post_send(&wr).map_err(|e| e.errno()))
        };
        match *op {
            Op::Recv { side, off, len, .. } => {
                let sg = [sge(mem(side), off, len)];
                let r = x.srq[side].post_recv(&RecvWr { wr_id: 900 + off as u64, sg_list: &sg });
                posted.push(format!("xrc recv {:?}", r.map_err(|e| e.errno())));
            }
            Op::Send { dir, src, len, imm, inline, recv, .. } => {
                if recv {
                    posted.extend(self.run_xrc(&Op::Recv {
                        pair: XRC,
                        side: dir,
                        off: 600,
                        len: 120,
                    }));
                }
                let sg = [sge(&self.mr[0], src, len)];
                let mut wr = SendWr::send(200, &sg).to_srq(srqn(dir, src));
                if inline && len <= 64 {
                    wr.send_flags |= SendFlags::INLINE;
                    wr.inline_data = &payload[..len];
                }
                if let Some(i) = imm {
                    wr = wr.with_imm(i);
                }
                posted.push(post("send", wr));
            }
            Op::Write { dir, src, dst, len, imm, key, recv, .. } => {
                if recv && imm.is_some() {
                    posted.extend(self.run_xrc(&Op::Recv {
                        pair: XRC,
                        side: dir,
                        off: 600,
                        len: 0,
                    }));
                }
                let (addr, rkey) = x.rkey(self, dir, key);
                let sg = [sge(&self.mr[0], src, len)];
                let mut wr =
                    SendWr::write(300, &sg, addr + dst as u64, rkey).to_srq(srqn(dir, src));
                if let Some(i) = imm {
                    wr = wr.with_imm(i);
                }
                posted.push(post("write", wr));
            }
            Op::Read { dir, src, dst, len, key, .. } => {
                let (addr, rkey) = x.rkey(self, dir, key);
                let sg = [sge(&self.mr[0], dst, len)];
                posted.push(post(
                    "read",
                    SendWr::read(400, &sg, addr + src as u64, rkey).to_srq(srqn(dir, src)),
                ));
            }
            Op::Atomic { dir, off, res, cswp, value, key, .. } => {
                let (addr, rkey) = x.rkey(self, dir, key);
                let at = addr + if off % 5 == 0 { off } else { off & !7 } as u64;
                let sg = [sge(&self.mr[0], res, 8)];
                let wr = if cswp {
                    let mut old = [0u8; 8];
                    if (off & !7) + 8 <= MEM {
                        mem(dir).read(off & !7, &mut old).unwrap();
                    }
                    let cmp = if value & 1 == 0 { u64::from_ne_bytes(old) } else { value };
                    SendWr::cmp_swap(500, &sg, at, rkey, cmp, value)
                } else {
                    SendWr::fetch_add(600, &sg, at, rkey, value)
                };
                posted.push(post("atomic", wr.to_srq(srqn(dir, off))));
            }
            Op::Error { side, .. } => {
                let err = QpAttr { qp_state: QpState::ERR, ..Default::default() };
                let qp = if side == 0 { &x.ini } else { &x.tgt };
                qp.modify(&err, QpAttrMask::STATE).unwrap();
            }
            Op::Reconnect { .. } => {
                let reset = QpAttr { qp_state: QpState::RESET, ..Default::default() };
                for q in [&x.ini, &x.tgt] {
                    q.modify(&reset, QpAttrMask::STATE).unwrap();
                }
                connect(&x.ini, &x.tgt, &params(), &params());
            }
            Op::UdRecv { .. } | Op::UdSend { .. } => unreachable!("not an XRC op"),
        }
        posted
    }

    /// Runs `op` and returns what it left: completions and QP states.
    fn run(&self, op: &Op) -> Vec<String> {
        let payload: Vec<u8> = (0..300u32).map(|i| (i * 13) as u8).collect();
        let mut posted = Vec::new();
        match *op {
            Op::Recv { pair: XRC, .. }
            | Op::Send { pair: XRC, .. }
            | Op::Write { pair: XRC, .. }
            | Op::Read { pair: XRC, .. }
            | Op::Atomic { pair: XRC, .. }
            | Op::Error { pair: XRC, .. }
            | Op::Reconnect { pair: XRC } => posted.extend(self.run_xrc(op)),
            Op::Recv { pair, side, off, len } => {
                let sg = [sge(&self.mr[side], off, len)];
                let wr = RecvWr { wr_id: 100 + off as u64, sg_list: &sg };
                let r = if pair == 1 {
                    self.srq[side].post_recv(&wr)
                } else {
                    self.qps[pair][side].post_recv(&wr)
                };
                posted.push(format!("recv {:?}", r.map_err(|e| e.errno())));
            }
            Op::Send { pair, dir, src, len, imm, inline, recv } => {
                if recv {
                    posted.extend(self.run(&Op::Recv { pair, side: 1 - dir, off: 600, len: 120 }));
                }
                let sg = [sge(&self.mr[dir], src, len)];
                let mut wr = SendWr::send(200, &sg);
                if inline && len <= 64 {
                    wr.send_flags |= SendFlags::INLINE;
                    wr.inline_data = &payload[..len];
                }
                if let Some(i) = imm {
                    wr = wr.with_imm(i);
                }
                let r = self.qps[pair][dir].post_send(&wr);
                posted.push(format!("send {:?}", r.map_err(|e| e.errno())));
            }
            Op::Write { pair, dir, src, dst, len, imm, key, recv } => {
                if recv && imm.is_some() {
                    posted.extend(self.run(&Op::Recv { pair, side: 1 - dir, off: 600, len: 0 }));
                }
                let (addr, rkey) = self.rkey(1 - dir, key);
                let sg = [sge(&self.mr[dir], src, len)];
                let mut wr = SendWr::write(300, &sg, addr + dst as u64, rkey);
                if let Some(i) = imm {
                    wr = wr.with_imm(i);
                }
                let r = self.qps[pair][dir].post_send(&wr);
                posted.push(format!("write {:?}", r.map_err(|e| e.errno())));
            }
            Op::Read { pair, dir, src, dst, len, key } => {
                let (addr, rkey) = self.rkey(1 - dir, key);
                let sg = [sge(&self.mr[dir], dst, len)];
                let wr = SendWr::read(400, &sg, addr + src as u64, rkey);
                let r = self.qps[pair][dir].post_send(&wr);
                posted.push(format!("read {:?}", r.map_err(|e| e.errno())));
            }
            Op::Atomic { pair, dir, off, res, cswp, value, key } => {
                let (addr, rkey) = self.rkey(1 - dir, key);
                // Mostly aligned targets, some not.
                let at = addr + if off % 5 == 0 { off } else { off & !7 } as u64;
                let sg = [sge(&self.mr[dir], res, 8)];
                let wr = if cswp {
                    let old = u64::from_ne_bytes(self.peek(1 - dir, off & !7));
                    let cmp = if value & 1 == 0 { old } else { value };
                    SendWr::cmp_swap(500, &sg, at, rkey, cmp, value)
                } else {
                    SendWr::fetch_add(600, &sg, at, rkey, value)
                };
                let r = self.qps[pair][dir].post_send(&wr);
                posted.push(format!("atomic {:?}", r.map_err(|e| e.errno())));
            }
            Op::UdRecv { side, off, len } => {
                let sg = [sge(&self.mr[side], off, len)];
                let wr = RecvWr { wr_id: 700 + off as u64, sg_list: &sg };
                let r = match side {
                    1 => self.srq[side].post_recv(&wr),
                    _ => self.ud[side].post_recv(&wr),
                };
                posted.push(format!("ud recv {:?}", r.map_err(|e| e.errno())));
            }
            Op::UdSend { write, dir, src, len, imm, inline, qkey, global, loopback, recv } => {
                let to = if loopback { dir } else { 1 - dir };
                if recv {
                    posted.extend(self.run(&Op::UdRecv { side: to, off: 500, len: 40 + 300 }));
                }
                let ah = if loopback { &self.own_ah } else { &self.ah };
                let qkey = match qkey {
                    Qkey::Good => QKEY,
                    Qkey::Bad => QKEY ^ 1,
                    Qkey::Own => 0x8000_0000,
                };
                let sg = [sge(&self.mr[dir], src, len)];
                let ah = &ah[dir][usize::from(global)];
                let mut wr = SendWr::send_ud(800, &sg, ah, self.ud[to].qp_num(), qkey);
                if inline && len <= 64 {
                    wr.send_flags |= SendFlags::INLINE;
                    wr.inline_data = &payload[..len];
                }
                if let Some(i) = imm {
                    wr = wr.with_imm(i);
                }
                if write {
                    wr.opcode = WrOpcode::RDMA_WRITE;
                    (wr.remote_addr, wr.rkey) = self.rkey(to, Key::Good);
                }
                let r = self.ud[dir].post_send(&wr);
                posted.push(format!("ud send {:?}", r.map_err(|e| e.errno())));
            }
            Op::Error { pair, side } => {
                let err = QpAttr { qp_state: QpState::ERR, ..Default::default() };
                let qp = if pair == UD { &self.ud[side] } else { &self.qps[pair][side] };
                qp.modify(&err, QpAttrMask::STATE).unwrap();
            }
            Op::Reconnect { pair: UD } => {
                let reset = QpAttr { qp_state: QpState::RESET, ..Default::default() };
                for q in &self.ud {
                    q.modify(&reset, QpAttrMask::STATE).unwrap();
                    ud_ready(q);
                }
            }
            Op::Reconnect { pair } => {
                let reset = QpAttr { qp_state: QpState::RESET, ..Default::default() };
                for q in &self.qps[pair] {
                    q.modify(&reset, QpAttrMask::STATE).unwrap();
                }
                connect(&self.qps[pair][0], &self.qps[pair][1], &params(), &params());
            }
        }
        for (s, cq) in self.cq.iter().enumerate() {
            while let Some(wc) = cq.poll_one() {
                posted.push(format!("cq{s} {wc:?}"));
            }
        }
        let xrc = self.xrc.iter().flat_map(|x| [&x.ini, &x.tgt]);
        for q in self.qps.iter().flatten().chain(&self.ud).chain(xrc) {
            let a = q.query().unwrap();
            posted.push(format!("qp {:?} sq_psn {} rq_psn {}", a.qp_state, a.sq_psn, a.rq_psn));
        }
        posted
    }

    fn peek(&self, side: usize, off: usize) -> [u8; 8] {
        let mut w = [0u8; 8];
        if off + 8 <= MEM {
            self.mr[side].read(off, &mut w).unwrap();
        }
        w
    }

    fn memory(&self) -> Vec<Vec<u8>> {
        self.mr
            .iter()
            .chain(&self.ro)
            .chain(self.xrc.as_ref().map(|x| &x.mr))
            .map(|m| {
                let mut v = vec![0u8; MEM];
                m.read(0, &mut v).unwrap();
                v
            })
            .collect()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(96), ..ProptestConfig::default() })]

    #[test]
    fn random_programs_leave_identical_traces_on_both_paths(
        ops in prop::collection::vec(op(), 1..80),
        rxe in any::<bool>(),
    ) {
        let profile = if rxe { Profile::Rxe } else { Profile::Full };
        let (fast, slow) = (World::new(profile, true), World::new(profile, false));
        for (i, op) in ops.iter().enumerate() {
            let (a, b) = (fast.run(op), slow.run(op));
            prop_assert_eq!(a, b, "step {} ({:?}) differs", i, op);
        }
        prop_assert!(fast.memory() == slow.memory(), "memory differs at the end");
    }
}

/// The express path does run: a WRITE between two QPs of this process completes within the
/// post, and switching it off at run time leaves the next WR to the packet path, with the same
/// result.
#[test]
fn switching_the_express_path_off_at_run_time_changes_nothing_visible() {
    let w = World::new(Profile::Full, true);
    let write = Op::Write {
        pair: 0,
        dir: 0,
        src: 0,
        dst: 8,
        len: 64,
        imm: Some(7),
        key: Key::Good,
        recv: false,
    };
    let recv = Op::Recv { pair: 0, side: 1, off: 512, len: 64 };
    let mut traces = Vec::new();
    for on in [true, false, true] {
        w._fabric.set_express(on);
        w.run(&recv);
        traces.push(w.run(&write));
    }
    assert_eq!(traces[0][0], "write Ok(())");
    // The same completions each time, with PSNs advanced by one message each.
    for t in &traces {
        assert!(
            t.iter().any(|l| l.starts_with("cq1") && l.contains("RECV_RDMA_WITH_IMM")),
            "{t:?}"
        );
        assert!(t.iter().any(|l| l.starts_with("cq0") && l.contains("RDMA_WRITE")), "{t:?}");
    }
}

/// One side of a connected RC pair: its context, PD, CQ, 4 KiB MR and QP.
type Side = (Context, Pd, Cq, Mr, Qp);

/// Two RC QPs on two devices of a new fabric, connected with `p`.
fn connected_pair(p: &RcParams) -> (Fabric, Side, Side) {
    let f = Fabric::new(FabricConfig { devices: 2, ..Default::default() });
    let devs = f.devices();
    let side = |d: &Device| {
        let ctx = d.open().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None, 0).unwrap();
        let mr = pd.reg_mr(4096, ALL_ACCESS).unwrap();
        let qp = pd.create_qp(&QpInitAttr::new(QpType::RC, &cq, cap(8))).unwrap();
        (ctx, pd, cq, mr, qp)
    };
    let (a, b) = (side(&devs[0]), side(&devs[1]));
    a.4.connect(1, &b.4.endpoint(2), p).unwrap();
    b.4.connect(2, &a.4.endpoint(1), p).unwrap();
    (f, a, b)
}

/// A QP its peer's express lane holds still goes when its last handle is dropped (without a
/// destroy): its PD can be deallocated at once, and the peer's next WRITE finds nobody there
/// (retries exhausted), as before the peer's lane held it. Both directions ran on the express
/// path first, so each lane held the other QP.
#[test]
fn a_qp_dropped_while_its_peers_lane_holds_it_is_gone() {
    let (_f, a, b) = connected_pair(&RcParams { timeout: 1, retry_cnt: 1, ..Default::default() });
    let write = |from: &Side, to: &Mr| {
        let src = [Sge { addr: from.3.addr(), length: 8, lkey: from.3.lkey() }];
        from.4.post_send(&SendWr::write(1, &src, to.addr(), to.rkey()).signaled()).unwrap();
        loop {
            if let Some(wc) = from.2.poll_one() {
                return wc.status;
            }
        }
    };
    assert_eq!(write(&a, &b.3), WcStatus::SUCCESS);
    assert_eq!(write(&b, &a.3), WcStatus::SUCCESS);
    let (b_ctx, b_pd, b_cq, b_mr, b_qp) = b;
    let (b_addr, b_rkey) = (b_mr.addr(), b_mr.rkey());
    drop(b_qp);
    b_mr.dereg().unwrap();
    b_pd.dealloc().expect("the dropped QP let its PD go");
    b_cq.destroy().expect("the dropped QP let its CQ go");
    let src = [Sge { addr: a.3.addr(), length: 8, lkey: a.3.lkey() }];
    a.4.post_send(&SendWr::write(2, &src, b_addr, b_rkey).signaled()).unwrap();
    let wc = loop {
        if let Some(wc) = a.2.poll_one() {
            break wc;
        }
    };
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::RETRY_EXC_ERR));
    drop(b_ctx);
}

/// A QP dropped with work in flight goes quiet though its peer's lane holds it: its timers find
/// it stopped and send nothing more (a fault rule that drops every packet counts what is sent).
#[test]
fn a_qp_dropped_with_work_in_flight_sends_nothing_more() {
    // Retransmissions every ~4 ms (timeout 10), as many as it takes (7 retries).
    let (f, a, b) = connected_pair(&RcParams { timeout: 10, ..Default::default() });
    // B's lane holds A.
    let src = [Sge { addr: b.3.addr(), length: 8, lkey: b.3.lkey() }];
    b.4.post_send(&SendWr::write(1, &src, a.3.addr(), a.3.rkey()).signaled()).unwrap();
    while b.2.poll_one().is_none() {}
    f.set_faults(FaultRule::parse("drop").unwrap());
    let src = [Sge { addr: a.3.addr(), length: 8, lkey: a.3.lkey() }];
    a.4.post_send(&SendWr::write(2, &src, b.3.addr(), b.3.rkey()).signaled()).unwrap();
    // Sent, then sent again at least once.
    let sent = || f.fault_hits()[0];
    while sent() < 2 {
        std::thread::yield_now();
    }
    let (_a_ctx, _a_pd, _a_cq, _a_mr, a_qp) = a;
    drop(a_qp);
    let at_drop = sent();
    // Several retransmission periods.
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(sent() <= at_drop + 1, "sent {} more after the drop", sent() - at_drop);
}
