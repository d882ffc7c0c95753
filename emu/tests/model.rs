//! Property tests: random RDMA WRITE / READ / atomics / SEND across several QP pairs, in both
//! directions, checked op by op against a plain memory model. Out-of-range accesses are drawn
//! on purpose: they must fail with `REM_ACCESS_ERR`, leave memory untouched, and the pair is
//! then reset and reconnected (which exercises RESET and the PSN state).

mod common;
use common::*;
use proptest::prelude::*;
use rdma_emu::*;

const MEM: usize = 1024;
const PAIRS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    Write { pair: usize, a_to_b: bool, src: usize, dst: usize, len: usize },
    Read { pair: usize, a_to_b: bool, src: usize, dst: usize, len: usize },
    FetchAdd { pair: usize, a_to_b: bool, word: usize, add: u64, res: usize },
    CmpSwap { pair: usize, a_to_b: bool, word: usize, cmp_hit: bool, swap: u64, res: usize },
    Send { pair: usize, a_to_b: bool, src: usize, dst: usize, len: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let pair = 0..PAIRS;
    let off = 0..MEM;
    // Lengths may run past the end of the MR: those must fail remotely.
    let len = 0usize..200;
    let word = 0..MEM / 8;
    prop_oneof![
        (pair.clone(), any::<bool>(), 0..MEM - 200, off.clone(), len.clone())
            .prop_map(|(pair, a_to_b, src, dst, len)| Op::Write { pair, a_to_b, src, dst, len }),
        (pair.clone(), any::<bool>(), off.clone(), 0..MEM - 200, len.clone())
            .prop_map(|(pair, a_to_b, src, dst, len)| Op::Read { pair, a_to_b, src, dst, len }),
        (pair.clone(), any::<bool>(), word.clone(), any::<u64>(), word.clone()).prop_map(
            |(pair, a_to_b, word, add, res)| Op::FetchAdd { pair, a_to_b, word, add, res: res * 8 }
        ),
        (pair.clone(), any::<bool>(), word.clone(), any::<bool>(), any::<u64>(), word).prop_map(
            |(pair, a_to_b, word, cmp_hit, swap, res)| Op::CmpSwap {
                pair,
                a_to_b,
                word,
                cmp_hit,
                swap,
                res: res * 8
            }
        ),
        (pair, any::<bool>(), 0..MEM - 200, 0..MEM - 200, len)
            .prop_map(|(pair, a_to_b, src, dst, len)| Op::Send { pair, a_to_b, src, dst, len }),
    ]
}

struct World {
    _fabric: Fabric,
    /// Two memories (side 0 on device 0, side 1 on device 1) and the model of each.
    mr: [Mr; 2],
    model: [Vec<u8>; 2],
    cq: [Cq; 2],
    /// qps[pair][side]
    qps: Vec<[Qp; 2]>,
}

impl World {
    fn new(profile: Profile) -> World {
        let fabric = Fabric::new(FabricConfig { devices: 2, profile, ..Default::default() });
        let devs = fabric.devices();
        let ctx: Vec<Context> = devs.iter().map(|d| d.open().unwrap()).collect();
        let pd: Vec<Pd> = ctx.iter().map(|c| c.alloc_pd().unwrap()).collect();
        let cq: Vec<Cq> = ctx.iter().map(|c| c.create_cq(256, None, 0).unwrap()).collect();
        let mr: Vec<Mr> = pd.iter().map(|p| p.reg_mr(MEM, ALL_ACCESS).unwrap()).collect();
        let mut qps = Vec::new();
        for _ in 0..PAIRS {
            let mk = |s: usize| new_qp(&pd[s], &cq[s], QpType::RC, 8, true);
            let pair = [mk(0), mk(1)];
            connect(&pair[0], &pair[1], &RcParams::default(), &RcParams::default());
            qps.push(pair);
        }
        // Start from non-zero memory so that misplaced bytes show.
        let mut model = [vec![0u8; MEM], vec![0u8; MEM]];
        for (s, m) in model.iter_mut().enumerate() {
            for (i, b) in m.iter_mut().enumerate() {
                *b = (i * 31 + s * 7) as u8;
            }
            mr[s].write(0, m).unwrap();
        }
        let [m0, m1]: [Mr; 2] = mr.try_into().unwrap();
        let [c0, c1]: [Cq; 2] = cq.try_into().unwrap();
        World { _fabric: fabric, mr: [m0, m1], model, cq: [c0, c1], qps }
    }

    fn reconnect(&self, pair: usize) {
        let reset = QpAttr { qp_state: QpState::RESET, ..Default::default() };
        for q in &self.qps[pair] {
            q.modify(&reset, QpAttrMask::STATE).unwrap();
        }
        // Drain any flushed completions.
        for cq in &self.cq {
            while cq.poll_one().is_some() {}
        }
        connect(&self.qps[pair][0], &self.qps[pair][1], &RcParams::default(), &RcParams::default());
    }

    fn word(&self, side: usize, w: usize) -> u64 {
        u64::from_ne_bytes(self.model[side][w * 8..w * 8 + 8].try_into().unwrap())
    }

    fn set_word(&mut self, side: usize, w: usize, v: u64) {
        self.model[side][w * 8..w * 8 + 8].copy_from_slice(&v.to_ne_bytes());
    }

    /// Runs one op and updates the model; returns an error text on a mismatch.
    fn run(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let (pair, a_to_b) = match *op {
            Op::Write { pair, a_to_b, .. }
            | Op::Read { pair, a_to_b, .. }
            | Op::FetchAdd { pair, a_to_b, .. }
            | Op::CmpSwap { pair, a_to_b, .. }
            | Op::Send { pair, a_to_b, .. } => (pair, a_to_b),
        };
        let (l, r) = if a_to_b { (0, 1) } else { (1, 0) };
        let qp = self.qps[pair][l].clone();
        let (lmr, rmr) = (self.mr[l].clone(), self.mr[r].clone());
        let (lmr, rmr) = (&lmr, &rmr);
        let (wc, expect_ok) = match *op {
            Op::Write { src, dst, len, .. } => {
                let ok = dst + len <= MEM || len == 0;
                qp.post_send(&SendWr::write(
                    1,
                    &[sge(lmr, src, len)],
                    rmr.addr() + dst as u64,
                    rmr.rkey(),
                ))
                .unwrap();
                if ok {
                    let data = self.model[l][src..src + len].to_vec();
                    self.model[r][dst..dst + len].copy_from_slice(&data);
                }
                (wait1(&self.cq[l]), ok)
            }
            Op::Read { src, dst, len, .. } => {
                let ok = src + len <= MEM || len == 0;
                qp.post_send(&SendWr::read(
                    2,
                    &[sge(lmr, dst, len)],
                    rmr.addr() + src as u64,
                    rmr.rkey(),
                ))
                .unwrap();
                if ok {
                    let data = self.model[r][src..src + len].to_vec();
                    self.model[l][dst..dst + len].copy_from_slice(&data);
                }
                (wait1(&self.cq[l]), ok)
            }
            Op::FetchAdd { word, add, res, .. } => {
                let old = self.word(r, word);
                qp.post_send(&SendWr::fetch_add(
                    3,
                    &[sge(lmr, res, 8)],
                    rmr.addr() + word as u64 * 8,
                    rmr.rkey(),
                    add,
                ))
                .unwrap();
                self.set_word(r, word, old.wrapping_add(add));
                self.model[l][res..res + 8].copy_from_slice(&old.to_ne_bytes());
                (wait1(&self.cq[l]), true)
            }
            Op::CmpSwap { word, cmp_hit, swap, res, .. } => {
                let old = self.word(r, word);
                let cmp = if cmp_hit { old } else { old ^ 1 };
                qp.post_send(&SendWr::cmp_swap(
                    4,
                    &[sge(lmr, res, 8)],
                    rmr.addr() + word as u64 * 8,
                    rmr.rkey(),
                    cmp,
                    swap,
                ))
                .unwrap();
                if cmp_hit {
                    self.set_word(r, word, swap);
                }
                self.model[l][res..res + 8].copy_from_slice(&old.to_ne_bytes());
                (wait1(&self.cq[l]), true)
            }
            Op::Send { src, dst, len, .. } => {
                let rqp = &self.qps[pair][r];
                rqp.post_recv(&RecvWr { wr_id: 9, sg_list: &[sge(rmr, dst, 200)] }).unwrap();
                qp.post_send(&SendWr::send(5, &[sge(lmr, src, len)])).unwrap();
                let data = self.model[l][src..src + len].to_vec();
                self.model[r][dst..dst + len].copy_from_slice(&data);
                let recv = wait1(&self.cq[r]);
                prop_assert_eq!(
                    (recv.status, recv.byte_len, recv.opcode),
                    (WcStatus::SUCCESS, len as u32, WcOpcode::RECV)
                );
                (wait1(&self.cq[l]), true)
            }
        };
        if expect_ok {
            prop_assert_eq!(wc.status, WcStatus::SUCCESS, "{:?}", op);
        } else {
            prop_assert_eq!(wc.status, WcStatus::REM_ACCESS_ERR, "{:?}", op);
            prop_assert_eq!(qp.state(), QpState::ERR);
            self.reconnect(pair);
        }
        for s in 0..2 {
            let mut got = vec![0u8; MEM];
            self.mr[s].read(0, &mut got).unwrap();
            prop_assert!(
                got == self.model[s],
                "memory of side {} differs from the model after {:?}",
                s,
                op
            );
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(64), ..ProptestConfig::default() })]

    #[test]
    fn random_operations_match_the_memory_model(ops in prop::collection::vec(op(), 1..60), rxe in any::<bool>()) {
        let mut w = World::new(if rxe { Profile::Rxe } else { Profile::Full });
        for op in &ops {
            w.run(op)?;
        }
    }
}

#[test]
fn concurrent_threads_on_their_own_qps_and_one_shared_counter() {
    // Four threads, each with its own QP pair, write their own region and fetch-add one shared
    // counter. Every completion arrives, every region holds its thread's data, and the counter
    // holds the sum of all adds.
    let fabric = Fabric::new(FabricConfig::default());
    let devs = fabric.devices();
    let target = node_on(&devs[1], 4096);
    let threads = 4;
    let iters = 2000u64;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let dev = devs[0].clone();
            let tpd = target.pd.clone();
            let tcq = target.cq.clone();
            let (addr, rkey) = (target.mr.addr(), target.mr.rkey());
            std::thread::spawn(move || {
                let me = node_on(&dev, 4096);
                let peer = new_qp(&tpd, &tcq, QpType::RC, 16, false);
                connect(&me.qp, &peer, &RcParams::default(), &RcParams::default());
                me.mr.write(0, &[t as u8 + 1; 64]).unwrap();
                for i in 0..iters {
                    me.qp
                        .post_send(
                            &SendWr::write(
                                i,
                                &[sge(&me.mr, 0, 64)],
                                addr + 64 * (t as u64 + 1),
                                rkey,
                            )
                            .signaled(),
                        )
                        .unwrap();
                    me.qp
                        .post_send(
                            &SendWr::fetch_add(i, &[sge(&me.mr, 128, 8)], addr, rkey, 1).signaled(),
                        )
                        .unwrap();
                    let wcs = wait_n(&me.cq, 2);
                    assert!(wcs.iter().all(|w| w.status == WcStatus::SUCCESS), "{wcs:?}");
                }
                peer
            })
        })
        .collect();
    let _peers: Vec<Qp> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(target.mr.read_u64(0).unwrap(), threads as u64 * iters);
    for t in 0..threads {
        let mut got = [0u8; 64];
        target.mr.read(64 * (t + 1), &mut got).unwrap();
        assert_eq!(got, [t as u8 + 1; 64]);
    }
}

#[test]
fn concurrent_posters_on_one_qp_keep_every_completion() {
    // Two threads post on the same QP at once; PSN order and delivery must stay consistent.
    // The CQ holds every completion: overrunning it would (rightly) lose them.
    let f = Fabric::new(FabricConfig::default());
    let devs = f.devices();
    let b = node_on(&devs[1], 4096);
    let ctx = devs[0].open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16_384, None, 0).unwrap();
    let mr = pd.reg_mr(64, ALL_ACCESS).unwrap();
    let qp = new_qp(&pd, &cq, QpType::RC, 64, false);
    connect(&qp, &b.qp, &RcParams::default(), &RcParams::default());
    let (addr, rkey) = (b.mr.addr(), b.mr.rkey());
    let handles: Vec<_> = (0..2)
        .map(|t| {
            let (qp, mr) = (qp.clone(), mr.clone());
            std::thread::spawn(move || {
                for i in 0..5000u64 {
                    let res = [sge(&mr, 8 * t as usize, 8)];
                    let wr = SendWr::fetch_add(t * 100_000 + i, &res, addr, rkey, 1).signaled();
                    loop {
                        match qp.post_send(&wr) {
                            Ok(()) => break,
                            Err(e) if e.errno() == Errno::ENOMEM => std::thread::yield_now(),
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            })
        })
        .collect();
    let wcs = wait_n(&cq, 10_000);
    handles.into_iter().for_each(|h| h.join().unwrap());
    assert!(wcs.iter().all(|w| w.status == WcStatus::SUCCESS));
    assert_eq!(b.mr.read_u64(0).unwrap(), 10_000);
}
