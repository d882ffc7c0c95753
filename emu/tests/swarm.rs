//! Swarm testing: random fault schedules against random RC workloads, in simulation, checking
//! what the transport promises whatever the faults: every signaled WR completes exactly once;
//! messages arrive exactly once and in order, or the QP fails with a retry status and flushes
//! the rest; nothing hangs; remote memory ends in a state the completions allow. A failing
//! case prints its seed and rules (proptest shrinks them); `FabricConfig::seed` replays it.

mod common;
use common::*;
use proptest::prelude::*;
use rdma_emu::*;

#[derive(Debug, Clone, Copy)]
enum Op {
    Send(u8),
    Write(u8),
    Read,
    FetchAdd,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u8..=200).prop_map(Op::Send),
        (1u8..=200).prop_map(Op::Write),
        Just(Op::Read),
        Just(Op::FetchAdd),
    ]
}

/// A fault schedule: some of the packet faults, each with a probability.
fn rules() -> impl Strategy<Value = String> {
    let kinds = ["drop", "dup", "reorder", "delay:by=3ms", "corrupt", "rnr"];
    let ops = ["", "op=request", "op=response", "op=ack", "op=send"];
    prop::collection::vec((0..kinds.len(), 0..ops.len(), 1u32..=30), 0..4).prop_map(move |v| {
        v.iter()
            .map(|&(k, o, p)| {
                let sep = if kinds[k].contains(':') { "," } else { ":" };
                let filter = if ops[o].is_empty() { String::new() } else { format!("{},", ops[o]) };
                format!("{}{sep}{filter}p=0.{p:02}", kinds[k])
            })
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// Polls `cq` until `n` completions arrived; `None` if it runs dry: no completion and no
/// deadline left to reach in virtual time (a hang).
fn drain(cq: &Cq, n: usize) -> Option<Vec<Wc>> {
    let mut out = Vec::new();
    let mut idle = 0;
    while out.len() < n {
        match cq.poll_one() {
            Some(wc) => {
                out.push(wc);
                idle = 0;
            }
            None => {
                idle += 1;
                if idle > 100_000 {
                    return None;
                }
            }
        }
    }
    Some(out)
}

fn run(seed: u64, rules: &str, ops: &[Op], retry_cnt: u8, rnr_retry: u8) -> Result<(), String> {
    let fabric = Fabric::new(FabricConfig {
        seed: Some(seed),
        faults: FaultRule::parse(rules).map_err(|e| e.to_string())?,
        ..Default::default()
    });
    let devs = fabric.devices();
    let (a, b) = (node_on(&devs[0], 1 << 16), node_on(&devs[1], 1 << 16));
    let p = RcParams { timeout: 12, retry_cnt, rnr_retry, ..Default::default() };
    connect(&a.qp, &b.qp, &p, &p);
    let sends = ops.iter().filter(|o| matches!(o, Op::Send(_))).count();
    for i in 0..sends {
        post_recv(&b.qp, i as u64, &[sge(&b.mr, 4096 + 256 * i, 256)]);
    }
    // Message i carries the byte i+1 (its identity) `len` times; WRITE i has its own slot.
    let mut sent = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let src = 256 * i;
        let sg = [sge(&a.mr, src, 8)];
        let wr = match *op {
            Op::Send(len) | Op::Write(len) => {
                a.mr.write(src, &vec![i as u8 + 1; len as usize]).unwrap();
                let sg = [sge(&a.mr, src, len as usize)];
                let wr = if let Op::Send(_) = op {
                    SendWr::send(i as u64, &sg)
                } else {
                    SendWr::write(i as u64, &sg, b.mr.addr() + 32768 + src as u64, b.mr.rkey())
                };
                a.qp.post_send(&wr.signaled()).map_err(|e| e.to_string())?;
                sent.push(i);
                continue;
            }
            Op::Read => SendWr::read(i as u64, &sg, b.mr.addr(), b.mr.rkey()),
            Op::FetchAdd => SendWr::fetch_add(i as u64, &sg, b.mr.addr() + 64, b.mr.rkey(), 1),
        };
        a.qp.post_send(&wr.signaled()).map_err(|e| e.to_string())?;
        sent.push(i);
    }
    let wcs = drain(&a.cq, sent.len()).ok_or("the sender hung")?;
    // Exactly once each, in posting order (RC completes in order).
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    let expected: Vec<u64> = sent.iter().map(|&i| i as u64).collect();
    if ids != expected {
        return Err(format!("completions {ids:?}, posted {expected:?}"));
    }
    // Successes, then at most one retry failure, then flushes.
    let first_bad = wcs.iter().position(|w| w.status != WcStatus::SUCCESS).unwrap_or(wcs.len());
    if let Some(w) = wcs.get(first_bad) {
        if !matches!(w.status, WcStatus::RETRY_EXC_ERR | WcStatus::RNR_RETRY_EXC_ERR) {
            return Err(format!("failed with {:?}", w.status));
        }
        if wcs[first_bad + 1..].iter().any(|w| w.status != WcStatus::WR_FLUSH_ERR) {
            return Err(format!("after the failure: {wcs:?}"));
        }
    }
    // The receiver got a prefix of the SENDs, in order, each once; every SEND that completed
    // successfully is in it.
    let ok_sends = wcs[..first_bad].iter().filter(|w| matches!(ops[w.wr_id as usize], Op::Send(_)));
    let ok_sends = ok_sends.count();
    let mut recvs = Vec::new();
    while let Some(r) = b.cq.poll_one() {
        recvs.push(r);
    }
    let good: Vec<&Wc> = recvs.iter().filter(|r| r.status == WcStatus::SUCCESS).collect();
    if good.len() < ok_sends || good.len() > sends {
        return Err(format!("{} receives for {ok_sends} delivered sends", good.len()));
    }
    let send_ops: Vec<usize> = (0..ops.len()).filter(|&i| matches!(ops[i], Op::Send(_))).collect();
    for (k, r) in good.iter().enumerate() {
        let i = send_ops[k];
        let Op::Send(len) = ops[i] else { unreachable!() };
        let mut got = vec![0u8; len as usize];
        b.mr.read(4096 + 256 * r.wr_id as usize, &mut got).unwrap();
        if r.wr_id != k as u64
            || r.byte_len != u32::from(len)
            || got.iter().any(|&x| x != i as u8 + 1)
        {
            return Err(format!("receive {k} holds {r:?} / {got:?}, expected message {i}"));
        }
    }
    // Memory: a completed WRITE's slot holds its data; the counter counts the fetch-and-adds
    // that completed, plus at most those executed whose answer was lost before the failure.
    for (i, op) in ops.iter().enumerate() {
        if let Op::Write(len) = *op {
            let mut got = vec![0u8; len as usize];
            b.mr.read(32768 + 256 * i, &mut got).unwrap();
            let done = (i as u64) < wcs.len() as u64 && wcs[i].status == WcStatus::SUCCESS;
            if done && got.iter().any(|&x| x != i as u8 + 1) {
                return Err(format!("WRITE {i} completed but its data is not there"));
            }
        }
    }
    let mut c = [0u8; 8];
    b.mr.read(64, &mut c).unwrap();
    let counter = u64::from_ne_bytes(c);
    let adds_ok = wcs[..first_bad].iter().filter(|w| matches!(ops[w.wr_id as usize], Op::FetchAdd));
    let adds_ok = adds_ok.count() as u64;
    let adds = ops.iter().filter(|o| matches!(o, Op::FetchAdd)).count() as u64;
    if counter < adds_ok || counter > adds {
        return Err(format!("counter {counter}: {adds_ok} adds completed of {adds}"));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(256), ..ProptestConfig::default() })]

    #[test]
    fn rc_keeps_its_promises_under_random_faults(
        seed in any::<u64>(),
        rules in rules(),
        ops in prop::collection::vec(op(), 1..24),
        retry_cnt in prop_oneof![Just(7u8), 0u8..=3],
        rnr_retry in prop_oneof![Just(7u8), 0u8..=3],
    ) {
        let res = run(seed, &rules, &ops, retry_cnt, rnr_retry);
        prop_assert!(res.is_ok(), "seed {} rules {:?}: {}", seed, rules, res.unwrap_err());
    }
}
