//! Generated verb programs: proptest strategies for a [`Plan`] (the objects, how the two QPs get
//! connected, and a list of steps), and the builder that turns a plan into a [`Program`] from the
//! catalogue's calls. Choices are small numbers whose 0 is the plain, valid case, so shrinking
//! walks a failing program toward the simplest one that still fails.
//!
//! Every step that posts work is followed by polls of both CQs, and the program ends by moving
//! both QPs to ERR and polling until every WR has completed, so a trace does not depend on how
//! fast the device is: work is quiescent before anything is destroyed or modified.

use crate::program::Program;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// QP transport of both QPs of a program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Rc,
    Uc,
    Ud,
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub transport: Transport,
    /// Per MR: length class and access bits (LW RW RR RA MW).
    pub mrs: Vec<(u8, u8)>,
    /// Access flags of each QP at INIT (RC/UC), as bits; 0 means all the type allows.
    pub qp_access: (u8, u8),
    pub srq: bool,
    pub chan: bool,
    /// 0: none; 1: type 1; 2: type 2.
    pub mw: u8,
    pub sig_all: bool,
    pub inline: bool,
    /// How the connection goes wrong: 0 not at all; else which modify is dropped, altered or
    /// moved (see [`Builder::connect`]).
    pub connect_fault: (u8, u8),
    /// RC retry_cnt and rnr_retry.
    pub retries: (u8, u8),
    pub steps: Vec<Step>,
}

/// One step of a plan; the numbers are choices, interpreted by [`Builder`].
#[derive(Clone, Debug)]
pub enum Step {
    Send { from_b: bool, op: u8, local: (u8, u8, u8), remote: (u8, u8, u8), flags: u8, count: u8 },
    Recv { on_b: bool, mr: u8, len: u8, count: u8 },
    SrqRecv { mr: u8, len: u8, count: u8 },
    Poll { b: bool },
    Modify { b: bool, state: u8 },
    Destroy { what: u8 },
    QueryQp { b: bool },
    BindType1 { mr: u8, range: u8, access: u8 },
    BindType2 { mr: u8, range: u8, access: u8 },
    ModifySrq { limit: u8 },
    QuerySrq,
    Notify { solicited: bool },
    ResizeCq { b: bool, size: u8 },
    Dump { mr: u8 },
    Fill { mr: u8, seed: u8 },
    Events,
}

fn step() -> impl Strategy<Value = Step> {
    let n = any::<u8>;
    prop_oneof![
        12 => (any::<bool>(), 0u8..10, (n(), n(), n()), (n(), n(), n()), 0u8..5, 1u8..4).prop_map(
            |(from_b, op, local, remote, flags, count)| Step::Send { from_b, op, local, remote, flags, count }
        ),
        6 => (any::<bool>(), n(), n(), 1u8..4).prop_map(|(on_b, mr, len, count)| Step::Recv { on_b, mr, len, count }),
        2 => (n(), n(), 1u8..4).prop_map(|(mr, len, count)| Step::SrqRecv { mr, len, count }),
        2 => any::<bool>().prop_map(|b| Step::Poll { b }),
        2 => (any::<bool>(), 0u8..7).prop_map(|(b, state)| Step::Modify { b, state }),
        2 => (0u8..10).prop_map(|what| Step::Destroy { what }),
        1 => any::<bool>().prop_map(|b| Step::QueryQp { b }),
        2 => (n(), n(), n()).prop_map(|(mr, range, access)| Step::BindType1 { mr, range, access }),
        2 => (n(), n(), n()).prop_map(|(mr, range, access)| Step::BindType2 { mr, range, access }),
        1 => n().prop_map(|limit| Step::ModifySrq { limit }),
        1 => Just(Step::QuerySrq),
        1 => any::<bool>().prop_map(|solicited| Step::Notify { solicited }),
        1 => (any::<bool>(), n()).prop_map(|(b, size)| Step::ResizeCq { b, size }),
        1 => n().prop_map(|mr| Step::Dump { mr }),
        1 => (n(), n()).prop_map(|(mr, seed)| Step::Fill { mr, seed }),
        1 => Just(Step::Events),
    ]
}

/// The strategy for plans.
pub fn plans() -> impl Strategy<Value = Plan> {
    let transport =
        prop_oneof![3 => Just(Transport::Rc), 1 => Just(Transport::Uc), 2 => Just(Transport::Ud)];
    (
        transport,
        prop::collection::vec((0u8..3, any::<u8>()), 1..4),
        (any::<u8>(), any::<u8>()),
        (any::<bool>(), any::<bool>(), 0u8..3, any::<bool>(), any::<bool>()),
        prop_oneof![4 => Just((0u8, 0u8)), 1 => (1u8..8, any::<u8>())],
        (0u8..3, 0u8..2),
        prop::collection::vec(step(), 1..12),
    )
        .prop_map(
            |(
                transport,
                mrs,
                qp_access,
                (srq, chan, mw, sig_all, inline),
                connect_fault,
                retries,
                steps,
            )| Plan {
                transport,
                mrs,
                qp_access,
                srq,
                chan,
                mw,
                sig_all,
                inline,
                connect_fault,
                retries,
                steps,
            },
        )
}

/// The name of each program a live run generates: a generated program's (`gen-...`), so the
/// deviations recorded for generated programs (`programs = gen-*`) explain it as they explain
/// the golden set's.
pub const LIVE: &str = "gen-live";

/// The name of each program a live run on extended QPs and CQs generates (`live --ex`): a
/// generated program's too, and one that deviations of the extended kinds alone can name.
pub const LIVE_EX: &str = "gen-live-ex";

/// `count` programs named `gen-00000`... drawn from `seed`: the same seed and count give the
/// same programs (as long as this file does not change).
pub fn generate(seed: u64, count: usize) -> Vec<Program> {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    );
    let strategy = plans();
    (0..count)
        .map(|i| {
            let plan = strategy.new_tree(&mut runner).expect("a plan").current();
            plan.program(&format!("gen-{i:05}"))
        })
        .collect()
}

/// `program` on extended objects: its QPs made by `ibv_create_qp_ex` and posted to through the
/// `ibv_wr_*` calls (`kinds` bit 0), its CQs made by `ibv_create_cq_ex` and polled through
/// `ibv_start_poll` (bit 1). A transform of what the plan makes, so that the golden set of
/// generated programs stays what it was recorded as.
pub fn extended(mut program: Program, kinds: u8) -> Program {
    for call in &mut program.calls {
        let verb = call.split(' ').next().unwrap_or("");
        if (verb == "qp" && kinds & 1 != 0) || (verb == "cq" && kinds & 2 != 0) {
            call.push_str(" ex");
        }
    }
    program
}

const MR_LENS: [usize; 3] = [64, 4096, 8192];
const ACCESS: [&str; 5] = ["LW", "RW", "RR", "RA", "MW"];
const OPS: [&str; 10] = [
    "SEND",
    "WRITE",
    "READ",
    "SEND_IMM",
    "WRITE_IMM",
    "FAA",
    "CAS",
    "SEND_INV",
    "LOCAL_INV",
    "BIND_MW",
];
const STATES: [&str; 7] = ["ERR", "RESET", "INIT", "RTR", "RTS", "SQD", "SQE"];
const LENS: [usize; 8] = [64, 0, 1, 8, 1024, 1025, 4096, 5000];

fn access(bits: u8) -> String {
    let v: Vec<&str> = (0..5).filter(|i| bits & (1 << i) != 0).map(|i| ACCESS[i]).collect();
    if v.is_empty() { "0".into() } else { v.join("|") }
}

impl Plan {
    /// The program this plan makes.
    pub fn program(&self, name: &str) -> Program {
        let mut b =
            Builder { plan: self, calls: Vec::new(), dead: Vec::new(), wr: 0, recv_wr: 1000 };
        b.setup();
        for step in &self.steps {
            b.step(step);
        }
        b.finish();
        Program { name: name.to_string(), calls: b.calls }
    }
}

struct Builder<'a> {
    plan: &'a Plan,
    calls: Vec<String>,
    /// Names that a destroy call may have removed: later steps leave them alone.
    dead: Vec<String>,
    wr: u64,
    recv_wr: u64,
}

impl Builder<'_> {
    fn emit(&mut self, call: String) {
        self.calls.push(call);
    }

    fn live(&self, name: &str) -> bool {
        !self.dead.iter().any(|d| d == name)
    }

    fn mr(&self, choice: u8) -> Option<(String, usize)> {
        let i = choice as usize % self.plan.mrs.len();
        let name = format!("mr{i}");
        self.live(&name).then(|| (name, MR_LENS[self.plan.mrs[i].0 as usize % MR_LENS.len()]))
    }

    fn qp(b: bool) -> &'static str {
        if b { "qb" } else { "qa" }
    }

    fn ty(&self) -> &'static str {
        match self.plan.transport {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Ud => "UD",
        }
    }

    fn setup(&mut self) {
        let p = self.plan;
        self.emit("pd pd0".into());
        for (i, &(len, bits)) in p.mrs.iter().enumerate() {
            // Mostly MRs with local write (reg_mr refuses remote write/atomic without it).
            let bits = if bits & 0x80 == 0 { bits | 1 } else { bits };
            self.emit(format!(
                "mr mr{i} pd0 {} {}",
                MR_LENS[len as usize % 3],
                access(bits & 0x1f)
            ));
            if bits & 0b1010 != 0 && bits & 1 == 0 {
                // Remote write or atomic without local write: refused, so never there.
                self.dead.push(format!("mr{i}"));
            }
        }
        if p.chan {
            self.emit("chan ch0".into());
        }
        self.emit(format!("cq cq0 32{}", if p.chan { " chan=ch0" } else { "" }));
        self.emit("cq cq1 32".into());
        if p.srq {
            self.emit("srq srq0 pd0 8 2".into());
        }
        let mut opts = String::new();
        if p.sig_all {
            opts.push_str(" sigall");
        }
        if p.inline {
            opts.push_str(" inline=64");
        }
        let ty = self.ty();
        self.emit(format!("qp qa {ty} pd0 cq0 cq0{opts}"));
        self.emit(format!("qp qb {ty} pd0 cq1 cq1{opts}{}", if p.srq { " srq=srq0" } else { "" }));
        if p.transport == Transport::Ud {
            self.emit("ah ah0 pd0".into());
        }
        if p.mw != 0 {
            self.emit(format!("mw mw0 pd0 {}", p.mw));
        }
        self.connect();
        if p.chan {
            self.emit("notify cq0".into());
        }
    }

    /// INIT, RTR and RTS on both QPs; `connect_fault` drops one of the six calls, omits an
    /// attribute from it, or swaps it with the next.
    fn connect(&mut self) {
        let p = self.plan;
        let mut calls = Vec::new();
        let access = |bits: u8| {
            if bits & 0x60 == 0x60 {
                format!(" access={}", access(bits & 0xf))
            } else {
                String::new()
            }
        };
        for (q, bits) in [("qa", p.qp_access.0), ("qb", p.qp_access.1)] {
            let extra = if p.transport == Transport::Ud { String::new() } else { access(bits) };
            calls.push(format!("modify {q} INIT{extra}"));
        }
        for (q, dest) in [("qa", "qb"), ("qb", "qa")] {
            calls.push(match p.transport {
                Transport::Ud => format!("modify {q} RTR"),
                _ => format!("modify {q} RTR dest={dest}"),
            });
        }
        for q in ["qa", "qb"] {
            calls.push(match p.transport {
                Transport::Rc => {
                    format!("modify {q} RTS retry={} rnr_retry={}", p.retries.0, p.retries.1)
                }
                _ => format!("modify {q} RTS"),
            });
        }
        let (fault, which) = p.connect_fault;
        let at = which as usize % calls.len();
        match fault {
            0 => {}
            1 | 2 => {
                calls.remove(at);
            }
            3 | 4 => {
                let omit = match (at / 2, p.transport) {
                    (0, Transport::Ud) => ["pkey", "port", "qkey"][which as usize / 8 % 3],
                    (0, _) => ["pkey", "port", "access"][which as usize / 8 % 3],
                    (1, Transport::Rc) => {
                        ["dest", "av", "mtu", "rq_psn", "min_rnr", "dest_rd_atomic"]
                            [which as usize / 8 % 6]
                    }
                    (1, Transport::Uc) => ["dest", "av", "mtu", "rq_psn"][which as usize / 8 % 4],
                    (2, Transport::Rc) => ["sq_psn", "timeout", "retry", "rnr_retry", "rd_atomic"]
                        [which as usize / 8 % 5],
                    _ => "sq_psn",
                };
                calls[at].push_str(&format!(" omit={omit}"));
            }
            5 => {
                // An RTR with a path MTU above the port's active one (RC/UC) or any (UD).
                let rtr = 2 + which as usize % 2;
                if let Some(c) = calls
                    .iter_mut()
                    .find(|c| c.starts_with(&format!("modify {} RTR", ["qa", "qb"][rtr - 2])))
                {
                    c.push_str(" mtu=4096");
                }
            }
            _ => {
                let next = (at + 1) % calls.len();
                calls.swap(at, next);
            }
        }
        for c in calls {
            self.emit(c);
        }
    }

    fn poll_both(&mut self) {
        for cq in ["cq0", "cq1"] {
            if self.live(cq) {
                self.emit(format!("poll {cq}"));
            }
        }
    }

    fn sge(&self, mr: u8, len: u8, kind: u8) -> Option<String> {
        let (name, mr_len) = self.mr(mr)?;
        let len = LENS[len as usize % LENS.len()].min(mr_len);
        Some(match kind % 8 {
            0..=3 => format!("sge={name}:0:{len}"),
            4 => format!("sge={name}:{}:{len}", mr_len - len),
            5 => format!("sge={name}:{}:{}", mr_len - len.max(1) + 1, len.max(1)),
            6 => format!("sge={name}:0:{len} lkey=bad"),
            _ => format!("sge={name}:0:{},{name}:{}:{}", len / 2, len / 2, len - len / 2),
        })
    }

    fn step(&mut self, step: &Step) {
        let p = self.plan;
        match *step {
            Step::Send { from_b, op, local, remote, flags, count } => {
                let (q, peer) = (Self::qp(from_b), Self::qp(!from_b));
                if !self.live(q) {
                    return;
                }
                let op = OPS[op as usize % OPS.len()];
                let atomic = op == "FAA" || op == "CAS";
                let mut call = format!("post_send {q} {op} wr={}", self.wr + 1);
                let (mr, len, kind) = local;
                let local = if atomic && kind % 4 != 3 {
                    self.mr(mr).map(|(name, _)| format!("sge={name}:8:8"))
                } else if op == "LOCAL_INV" || op == "BIND_MW" {
                    None
                } else {
                    self.sge(mr, len, kind)
                };
                if let Some(s) = local {
                    call.push(' ');
                    call.push_str(&s);
                }
                if matches!(op, "WRITE" | "WRITE_IMM" | "READ" | "FAA" | "CAS") {
                    let (rmr, roff, rkind) = remote;
                    let target = if p.mw != 0 && rkind % 5 == 4 && self.live("mw0") {
                        Some(("mw0".to_string(), 64))
                    } else {
                        self.mr(rmr)
                    };
                    let Some((target, target_len)) = target else { return };
                    let off = match (atomic, roff % 4) {
                        (true, 3) => 4,
                        (true, _) => 16,
                        (false, 3) => target_len.saturating_sub(16),
                        (false, _) => 0,
                    };
                    call.push_str(&format!(" remote={target}:{off}"));
                    if rkind % 5 == 3 {
                        call.push_str(" rkey=bad");
                    }
                }
                match op {
                    "SEND_IMM" | "WRITE_IMM" => call.push_str(&format!(" imm={}", self.wr + 1)),
                    "FAA" => call.push_str(" add=1"),
                    "CAS" => call.push_str(" cmp=0 swap=7"),
                    "SEND_INV" | "LOCAL_INV" => {
                        // Never a type-2 window: kernel 6.1's rxe dereferences a NULL MR when
                        // one that is not bound is invalidated (docs/conformance.md, rxe crashes).
                        let target = if p.mw == 1 && self.live("mw0") {
                            "mw0".to_string()
                        } else {
                            format!("mr{}", remote.0 as usize % p.mrs.len())
                        };
                        if !self.live(&target) {
                            return;
                        }
                        call.push_str(&format!(" inv={target}"));
                    }
                    "BIND_MW" => {
                        let Some((mr, mr_len)) = self.mr(remote.0) else { return };
                        if p.mw == 0 || !self.live("mw0") {
                            return;
                        }
                        call.push_str(&format!(
                            " mw=mw0 mr={mr} off=0 len={} access=RW|RR",
                            mr_len.min(64)
                        ));
                    }
                    _ => {}
                }
                if p.transport == Transport::Ud {
                    if !self.live("ah0") || !self.live(peer) {
                        return;
                    }
                    let qkey = if remote.2 % 8 == 7 { "0x22222222" } else { "0x11111111" };
                    call.push_str(&format!(" ah=ah0 dqp={peer} qkey={qkey}"));
                }
                let inline_op = matches!(op, "SEND" | "SEND_IMM" | "WRITE" | "WRITE_IMM");
                call.push_str(match flags {
                    0 => "",
                    1 => " flags=sig|sol",
                    // Inline only where it is defined: rxe takes it on any opcode (a documented
                    // deviation, scenario rc_inline_flag_on_other_opcodes), which would end the
                    // comparison of every program that tried it.
                    2 if inline_op => " flags=sig|inl",
                    2 => " flags=sig|fence",
                    3 => " flags=sig|fence",
                    // Unsignaled only where sigall signals it anyway: an unsignaled WR that
                    // fails completes whenever the failure is found, which no poll can wait for.
                    _ if p.sig_all => " flags=0",
                    _ => " flags=sig|sol",
                });
                if count > 1 {
                    call.push_str(&format!(" count={count}"));
                }
                self.wr += u64::from(count.max(1));
                self.emit(call);
                self.poll_both();
            }
            Step::Recv { on_b, mr, len, count } => {
                let q = Self::qp(on_b);
                let Some((name, mr_len)) = self.mr(mr) else { return };
                if !self.live(q) {
                    return;
                }
                let len = [4096, 64, 1024, 40, 104, 8, 2000, 0][len as usize % 8].min(mr_len);
                self.emit(format!(
                    "post_recv {q} wr={} sge={name}:0:{len}{}",
                    self.recv_wr + 1,
                    counted(count)
                ));
                self.recv_wr += u64::from(count.max(1));
            }
            Step::SrqRecv { mr, len, count } => {
                let Some((name, mr_len)) = self.mr(mr) else { return };
                if !p.srq || !self.live("srq0") {
                    return;
                }
                let len = [4096, 64, 1024, 40][len as usize % 4].min(mr_len);
                self.emit(format!(
                    "post_srq_recv srq0 wr={} sge={name}:0:{len}{}",
                    self.recv_wr + 1,
                    counted(count)
                ));
                self.recv_wr += u64::from(count.max(1));
            }
            Step::Poll { b } => {
                let cq = if b { "cq1" } else { "cq0" };
                if self.live(cq) {
                    self.emit(format!("poll {cq}"));
                }
            }
            Step::Modify { b, state } => {
                let q = Self::qp(b);
                if self.live(q) {
                    self.emit(format!("modify {q} {}", STATES[state as usize % STATES.len()]));
                    self.poll_both();
                }
            }
            Step::Destroy { what } => {
                let (verb, name) = match what {
                    0 => ("dealloc_pd", "pd0".to_string()),
                    1 | 2 => ("dereg_mr", format!("mr{}", what as usize % p.mrs.len())),
                    3 => ("destroy_cq", "cq1".into()),
                    4 => ("destroy_qp", "qb".into()),
                    5 => ("destroy_srq", "srq0".into()),
                    6 => ("dealloc_mw", "mw0".into()),
                    7 => ("destroy_ah", "ah0".into()),
                    8 => ("destroy_chan", "ch0".into()),
                    _ => ("destroy_qp", "qa".into()),
                };
                let exists = match verb {
                    "destroy_srq" => p.srq,
                    "dealloc_mw" => p.mw != 0,
                    "destroy_ah" => p.transport == Transport::Ud,
                    "destroy_chan" => p.chan,
                    _ => true,
                };
                if exists && self.live(&name) {
                    self.emit(format!("{verb} {name}"));
                    self.dead.push(name);
                }
            }
            Step::QueryQp { b } => {
                let q = Self::qp(b);
                if self.live(q) {
                    self.emit(format!("query_qp {q}"));
                }
            }
            Step::BindType1 { mr, range, access: bits }
            | Step::BindType2 { mr, range, access: bits } => {
                let Some((name, mr_len)) = self.mr(mr) else { return };
                if p.mw == 0 || !self.live("mw0") || !self.live("qa") {
                    return;
                }
                let (off, len) = match range % 4 {
                    0 | 1 => (0, mr_len.min(64)),
                    2 => (mr_len / 2, mr_len / 2),
                    _ => (mr_len - 8, 16),
                };
                let acc = access(1 << 1 | (bits & 0xc)).replace("MW", "");
                self.wr += 1;
                if matches!(step, Step::BindType1 { .. }) {
                    self.emit(format!("bind_mw mw0 qa {name} {off} {len} {acc} wr={}", self.wr));
                } else {
                    self.emit(format!(
                        "post_send qa BIND_MW wr={} mw=mw0 mr={name} off={off} len={len} access={acc}",
                        self.wr
                    ));
                }
                self.poll_both();
            }
            Step::ModifySrq { limit } => {
                if p.srq && self.live("srq0") {
                    self.emit(format!("modify_srq srq0 limit={}", limit % 10));
                }
            }
            Step::QuerySrq => {
                if p.srq && self.live("srq0") {
                    self.emit("query_srq srq0".into());
                }
            }
            Step::Notify { solicited } => {
                if p.chan && self.live("ch0") && self.live("cq0") {
                    self.emit(format!("notify cq0{}", if solicited { " sol" } else { "" }));
                }
            }
            Step::ResizeCq { b, size } => {
                let cq = if b { "cq1" } else { "cq0" };
                if self.live(cq) {
                    self.emit(format!("resize_cq {cq} {}", [64, 16, 40000][size as usize % 3]));
                }
            }
            Step::Dump { mr } => {
                if let Some((name, _)) = self.mr(mr) {
                    self.emit(format!("dump {name} 0 16"));
                }
            }
            Step::Fill { mr, seed } => {
                if let Some((name, len)) = self.mr(mr) {
                    self.emit(format!("fill {name} 0 {} {seed}", len.min(64)));
                }
            }
            Step::Events => self.emit("events".into()),
        }
    }

    /// Both QPs to ERR (every outstanding WR flushes), every completion polled, the events, and
    /// the first bytes of each MR (what WRITEs, READs and atomics left there).
    fn finish(&mut self) {
        for q in ["qa", "qb"] {
            if self.live(q) {
                self.emit(format!("modify {q} ERR"));
            }
        }
        self.poll_both();
        if self.plan.chan && self.live("ch0") {
            self.emit("cq_event ch0".into());
        }
        self.emit("events".into());
        for i in 0..self.plan.mrs.len() {
            if let Some((name, _)) = self.mr(i as u8) {
                self.emit(format!("dump {name} 0 24"));
            }
        }
    }
}

fn counted(count: u8) -> String {
    if count > 1 { format!(" count={count}") } else { String::new() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deviation recorded for generated programs explains a live run's program too (a live
    /// run once stopped at rxe's documented LOC_QP_OP_ERR for a UD receive too short, which
    /// `gen-*` scoped to the golden set alone).
    #[test]
    fn live_programs_are_named_as_generated_ones() {
        let devs = crate::deviations::parse(include_str!("../deviations.txt")).unwrap();
        let for_generated = devs.iter().filter(|d| d.programs.iter().any(|p| p == "gen-*"));
        assert!(for_generated.clone().count() > 0);
        for d in for_generated {
            assert!(d.programs.iter().any(|p| crate::deviations::glob(p, LIVE)), "{}", d.id);
            assert!(d.programs.iter().any(|p| crate::deviations::glob(p, LIVE_EX)), "{}", d.id);
        }
        for p in generate(3, 5) {
            assert!(crate::deviations::glob("gen-*", &p.name), "{}", p.name);
        }
        // What explains a plain live program explains one on extended QPs and CQs.
        for d in devs.iter().filter(|d| d.programs.iter().any(|p| p == LIVE)) {
            assert!(d.programs.iter().any(|p| p == LIVE_EX), "{}", d.id);
        }
    }

    /// `--ex` turns the QPs, the CQs or both of a plan's program into the extended kinds and
    /// touches no other call.
    #[test]
    fn extended_marks_only_the_qps_and_cqs_it_is_asked_to() {
        let plain = generate(5, 1).remove(0);
        let made = |kinds| extended(plain.clone(), kinds).calls;
        let marked = |calls: &[String], verb: &str| {
            let of: Vec<_> = calls.iter().filter(|c| c.starts_with(&format!("{verb} "))).collect();
            assert!(!of.is_empty(), "{verb} never made");
            of.iter().all(|c| c.ends_with(" ex"))
        };
        assert_eq!(made(0), plain.calls);
        assert!(marked(&made(1), "qp") && !marked(&made(1), "cq"));
        assert!(!marked(&made(2), "qp") && marked(&made(2), "cq"));
        assert!(marked(&made(3), "qp") && marked(&made(3), "cq"));
        let others = |calls: Vec<String>| -> Vec<String> {
            calls.into_iter().filter(|c| !c.starts_with("qp ") && !c.starts_with("cq ")).collect()
        };
        assert_eq!(others(made(3)), others(plain.calls.clone()));
    }

    #[test]
    fn the_same_seed_gives_the_same_programs() {
        assert_eq!(generate(7, 20), generate(7, 20));
        assert_ne!(generate(7, 20), generate(8, 20));
    }

    #[test]
    fn generated_calls_are_catalogued_and_cover_it() {
        let programs = generate(1, 400);
        let mut seen = std::collections::BTreeSet::new();
        for p in &programs {
            for c in &p.calls {
                let verb = c.split(' ').next().unwrap();
                assert!(crate::catalogue::verb(verb).is_some(), "{verb} is not catalogued");
                seen.insert(verb.to_string());
            }
        }
        // Multicast is in the scenarios (ud.verbs) alone: generated, it would change the
        // programs every recorded seed makes.
        let skipped = ["query_device", "query_port", "attach_mcast", "detach_mcast"];
        for v in crate::catalogue::VERBS {
            assert!(
                seen.contains(v.name) || skipped.contains(&v.name),
                "{} is never generated",
                v.name
            );
        }
    }
}
