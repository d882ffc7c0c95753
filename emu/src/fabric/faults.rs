//! Fault rules: what the fabric does to packets on their way (drop, corrupt, delay, duplicate,
//! reorder, partition), what it makes responders do (RNR storms), and what it does at a given
//! time (port down and up, device fatal, CQ overrun).
//!
//! Rules are written in a small language (see [`FaultRule::parse`] and `docs/faults.md`) so
//! the same text works from Rust, from C, from `RDMA_EMU_FAULTS` and from `rdma-emu run
//! --faults`. Every random choice comes from the fabric's seeded generator, in packet order,
//! so a seed replays a run.

use crate::sync::Mutex;

use super::{FabricInner, timer::Job};
use crate::{
    error::ConfigError,
    packet::{Kind, Packet, Syndrome},
    types::{EventType, PortState},
};

/// What a rule does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FaultAction {
    /// The packet is lost.
    Drop,
    /// The packet arrives damaged: the receiver's ICRC check fails and drops it (a packet
    /// trace shows it with a bad ICRC).
    Corrupt,
    /// The packet arrives this many nanoseconds late.
    Delay(u64),
    /// The packet arrives twice.
    Duplicate,
    /// The packet is held back until the next packet of the same flow (same source and
    /// destination QP) has passed it, or for at most this many nanoseconds.
    Reorder(u64),
    /// Link partition: a drop between two devices (`a=`, `b=`), normally for a while.
    Partition,
    /// The responder answers a matching SEND with an RNR NAK as if no receive were posted.
    Rnr,
    /// At `after=`, port `port` of device `dev` goes down (`PORT_ERR`; packets to and from it
    /// are lost); after `for=`, if given, it comes back (`PORT_ACTIVE`).
    PortDown { dev: u32, port: u8 },
    /// At `after=`, device `dev` fails: `DEVICE_FATAL` on its contexts, and every QP on it
    /// enters the error state (its work requests flushed).
    DeviceFatal { dev: u32 },
    /// At `after=`, device `dev` is hot-unplugged: as `DeviceFatal`, and each connection
    /// manager id on it hears `DEVICE_REMOVAL` (its connection ended, the peer told).
    DeviceRemoval { dev: u32 },
    /// At `after=`, the CQ that QP `qp=` sends its completions to overruns: `CQ_ERR`, and
    /// the completions that follow are lost.
    CqOverrun,
}

/// Which packets a packet rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacketClass {
    Send,
    Write,
    ReadRequest,
    ReadResponse,
    Atomic,
    AtomicAck,
    Ack,
    Nak,
    RnrNak,
    /// Any request (SEND, WRITE, READ request, atomic).
    Request,
    /// Any response (ACK, NAK, READ response, atomic ACK).
    Response,
}

impl PacketClass {
    fn of(name: &str) -> Option<PacketClass> {
        use PacketClass as C;
        Some(match name {
            "send" => C::Send,
            "write" => C::Write,
            "read" => C::ReadRequest,
            "read-resp" => C::ReadResponse,
            "atomic" => C::Atomic,
            "atomic-ack" => C::AtomicAck,
            "ack" => C::Ack,
            "nak" => C::Nak,
            "rnr-nak" => C::RnrNak,
            "request" => C::Request,
            "response" => C::Response,
            _ => return None,
        })
    }

    fn matches(self, p: &Packet) -> bool {
        use PacketClass as C;
        match self {
            C::Send => p.kind == Kind::Send,
            C::Write => p.kind == Kind::Write,
            C::ReadRequest => p.kind == Kind::ReadRequest,
            C::ReadResponse => p.kind == Kind::ReadResponse,
            C::Atomic => matches!(p.kind, Kind::CompareSwap | Kind::FetchAdd),
            C::AtomicAck => p.kind == Kind::AtomicAck,
            C::Ack => p.kind == Kind::Ack && p.syndrome == Syndrome::Ack,
            C::Nak => p.kind == Kind::Ack && matches!(p.syndrome, Syndrome::Nak(_)),
            C::RnrNak => p.kind == Kind::Ack && matches!(p.syndrome, Syndrome::Rnr(_)),
            C::Request => p.kind.is_request(),
            C::Response => !p.kind.is_request(),
        }
    }
}

/// One fault rule.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    pub action: FaultAction,
    /// Packets from or to this QPN.
    pub qp: Option<u32>,
    /// Packets from this QPN.
    pub src: Option<u32>,
    /// Packets to this QPN.
    pub dst: Option<u32>,
    pub class: Option<PacketClass>,
    /// Packets between these two devices (either way), by index.
    pub between: Option<(u32, u32)>,
    /// Probability that a matching packet is hit (1 by default).
    pub p: f64,
    /// Only the n-th matching packet (1-based).
    pub nth: Option<u64>,
    /// At most this many hits.
    pub count: Option<u64>,
    /// Nanoseconds after the rules were set before the rule applies (timed rules: fire).
    pub after: u64,
    /// Nanoseconds the rule applies for (port-down: how long the port stays down).
    pub duration: Option<u64>,
}

impl FaultRule {
    /// Parses a rule list: rules separated by `;`, each `ACTION[:KEY=VALUE[,KEY=VALUE]...]`.
    ///
    /// Actions: `drop`, `corrupt`, `delay` (`by=DUR`, default 1ms), `dup`, `reorder`
    /// (`by=DUR`: the longest hold, default 1ms), `partition` (`a=DEV,b=DEV`), `rnr`,
    /// `port-down` (`dev=DEV`, `port=N` default 1), `device-fatal` (`dev=DEV`),
    /// `device-removal` (`dev=DEV`), `cq-overrun`
    /// (`qp=QPN`). Packet filters: `qp=`, `src=`, `dst=` (QPNs, decimal or 0x hex), `op=`
    /// (`send`, `write`, `read`, `read-resp`, `atomic`, `atomic-ack`, `ack`, `nak`,
    /// `rnr-nak`, `request`, `response`), `a=`/`b=` (devices: `emu1` or `1`). Selection:
    /// `p=` (probability), `nth=`, `count=`, `after=DUR`, `for=DUR`. Durations take `ns`,
    /// `us`, `ms` or `s`.
    pub fn parse(spec: &str) -> Result<Vec<FaultRule>, ConfigError> {
        spec.split(';').map(str::trim).filter(|r| !r.is_empty()).map(parse_rule).collect()
    }

    fn is_timed(&self) -> bool {
        matches!(
            self.action,
            FaultAction::PortDown { .. }
                | FaultAction::DeviceFatal { .. }
                | FaultAction::DeviceRemoval { .. }
                | FaultAction::CqOverrun
        )
    }

    fn matches(&self, p: &Packet, since: u64) -> bool {
        let window = since >= self.after && self.duration.is_none_or(|d| since < self.after + d);
        window
            && self.qp.is_none_or(|q| p.src_qpn == q || p.dst_qpn == q)
            && self.src.is_none_or(|q| p.src_qpn == q)
            && self.dst.is_none_or(|q| p.dst_qpn == q)
            && self.class.is_none_or(|c| c.matches(p))
            && self.between.is_none_or(|(a, b)| {
                (p.src_dev, p.dst_dev) == (a, b) || (p.src_dev, p.dst_dev) == (b, a)
            })
    }
}

fn parse_rule(text: &str) -> Result<FaultRule, ConfigError> {
    let bad = |what: &str| ConfigError(format!("fault rule {text:?}: {what}"));
    let (name, params) = text.split_once(':').unwrap_or((text, ""));
    let mut kv = Vec::new();
    for p in params.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = p.split_once('=').ok_or_else(|| bad("parameters are KEY=VALUE"))?;
        kv.push((k.trim(), v.trim()));
    }
    let get = |key: &str| kv.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
    for (k, _) in &kv {
        const KEYS: [&str; 14] = [
            "p", "nth", "count", "after", "for", "qp", "src", "dst", "op", "a", "b", "by", "dev",
            "port",
        ];
        if !KEYS.contains(k) {
            return Err(bad(&format!("unknown parameter {k:?}")));
        }
    }
    let qpn = |key: &str| get(key).map(|v| parse_u32(v).ok_or_else(|| bad("a QPN"))).transpose();
    let dur = |key: &str| get(key).map(|v| parse_duration(v).ok_or_else(|| bad("a duration")));
    let dev = |key: &str| get(key).map(|v| parse_device(v).ok_or_else(|| bad("a device")));
    let by = dur("by").transpose()?.unwrap_or(1_000_000);
    let action = match name.trim() {
        "drop" => FaultAction::Drop,
        "corrupt" => FaultAction::Corrupt,
        "delay" => FaultAction::Delay(by),
        "dup" | "duplicate" => FaultAction::Duplicate,
        "reorder" => FaultAction::Reorder(by),
        "partition" => FaultAction::Partition,
        "rnr" => FaultAction::Rnr,
        "port-down" => FaultAction::PortDown {
            dev: dev("dev").ok_or_else(|| bad("needs dev="))??,
            port: get("port").map_or(Some(1), |v| v.parse().ok()).ok_or_else(|| bad("a port"))?,
        },
        "device-fatal" => {
            FaultAction::DeviceFatal { dev: dev("dev").ok_or_else(|| bad("needs dev="))?? }
        }
        "device-removal" => {
            FaultAction::DeviceRemoval { dev: dev("dev").ok_or_else(|| bad("needs dev="))?? }
        }
        "cq-overrun" => FaultAction::CqOverrun,
        other => return Err(bad(&format!("unknown action {other:?}"))),
    };
    let between = match (dev("a").transpose()?, dev("b").transpose()?) {
        (Some(a), Some(b)) => Some((a, b)),
        (None, None) => None,
        _ => return Err(bad("a= and b= go together")),
    };
    if action == FaultAction::Partition && between.is_none() {
        return Err(bad("partition needs a= and b="));
    }
    let p = get("p").map_or(Some(1.0), |v| v.parse::<f64>().ok()).ok_or_else(|| bad("p="))?;
    if !(0.0..=1.0).contains(&p) {
        return Err(bad("p= is a probability, 0 to 1"));
    }
    let number = |key: &str| {
        get(key).map(|v| v.parse::<u64>().ok().filter(|&n| n > 0).ok_or_else(|| bad(key)))
    };
    let rule = FaultRule {
        action,
        qp: qpn("qp")?,
        src: qpn("src")?,
        dst: qpn("dst")?,
        class: get("op").map(|v| PacketClass::of(v).ok_or_else(|| bad("op="))).transpose()?,
        between,
        p,
        nth: number("nth").transpose()?,
        count: number("count").transpose()?,
        after: dur("after").transpose()?.unwrap_or(0),
        duration: dur("for").transpose()?,
    };
    if rule.action == FaultAction::CqOverrun && rule.qp.is_none() {
        return Err(bad("cq-overrun needs qp="));
    }
    Ok(rule)
}

fn parse_u32(v: &str) -> Option<u32> {
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

/// `emu1` or `1`.
fn parse_device(v: &str) -> Option<u32> {
    v.strip_prefix("emu").unwrap_or(v).parse().ok()
}

/// Nanoseconds in `5ms`, `200us`, `1s`, `30ns`.
fn parse_duration(v: &str) -> Option<u64> {
    let split = v.find(|c: char| !c.is_ascii_digit() && c != '.')?;
    let (n, unit) = v.split_at(split);
    let n: f64 = n.parse().ok()?;
    let scale = match unit {
        "ns" => 1.0,
        "us" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        _ => return None,
    };
    (n >= 0.0).then_some((n * scale) as u64)
}

/// SplitMix64: a fixed generator, so that a seed replays the same run in every version (a
/// crate is free to change its streams).
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// True with probability `p`.
    fn chance(&mut self, p: f64) -> bool {
        p >= 1.0 || ((self.next_u64() >> 11) as f64) < p * (1u64 << 53) as f64
    }
}

/// A seed for a run that was given none: from the clock and the process, so that two runs
/// differ (and the seed is reported, to replay one).
pub(crate) fn clock_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    Rng::new(t ^ u64::from(std::process::id()) << 32).next_u64()
}

/// What happens to a packet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Verdict {
    Pass,
    Drop,
    Corrupt,
    Delay(u64),
    Duplicate,
    Reorder(u64),
}

#[derive(Debug)]
struct Armed {
    rule: FaultRule,
    seen: u64,
    hits: u64,
    /// Port-down: the port is down (the next firing brings it up).
    down: bool,
}

impl Armed {
    fn new(rule: FaultRule) -> Armed {
        Armed { rule, seen: 0, hits: 0, down: false }
    }
}

#[derive(Debug, Default)]
struct State {
    rules: Vec<Armed>,
    /// When the rules were set (the origin of `after=`).
    since: u64,
    /// Bumped when the rules are replaced, so that stale timed jobs do nothing.
    generation: u64,
    /// Packets held back for reordering, with their flow.
    held: Vec<((u32, u32, u32), Packet)>,
}

/// The fabric's fault rules and its seeded generator.
#[derive(Debug)]
pub(crate) struct Faults {
    st: Mutex<State>,
    rng: Mutex<Rng>,
    seed: u64,
}

impl Faults {
    pub(crate) fn new(seed: u64) -> Faults {
        Faults { st: Mutex::default(), rng: Mutex::new(Rng::new(seed)), seed }
    }

    pub(crate) fn seed(&self) -> u64 {
        self.seed
    }

    /// Replaces the rules; timed ones are scheduled from `now`.
    pub(crate) fn set(&self, fabric: &FabricInner, rules: Vec<FaultRule>) {
        let now = fabric.now();
        let mut st = self.st.lock();
        st.generation += 1;
        st.since = now;
        st.rules = rules.into_iter().map(Armed::new).collect();
        for (i, a) in st.rules.iter().enumerate() {
            if a.rule.is_timed() {
                let job = Job::Fault { generation: st.generation, rule: i };
                fabric.timer.schedule(now + a.rule.after, job);
            }
        }
        // Any rule set: the packet path takes the rules' lock only then (`FabricInner::faulted`).
        fabric.detours.set(super::Detours::FAULTS, !st.rules.is_empty());
    }

    /// How many times each rule has hit, in order.
    pub(crate) fn hits(&self) -> Vec<u64> {
        self.st.lock().rules.iter().map(|a| a.hits).collect()
    }

    /// What happens to `pkt` on the wire (the first rule that hits decides).
    pub(crate) fn judge(&self, pkt: &Packet, now: u64) -> Verdict {
        let mut st = self.st.lock();
        let since = now.saturating_sub(st.since);
        for a in st.rules.iter_mut() {
            let verdict = match a.rule.action {
                FaultAction::Drop | FaultAction::Partition => Verdict::Drop,
                FaultAction::Corrupt => Verdict::Corrupt,
                FaultAction::Delay(ns) => Verdict::Delay(ns),
                FaultAction::Duplicate => Verdict::Duplicate,
                FaultAction::Reorder(ns) => Verdict::Reorder(ns),
                _ => continue,
            };
            if self.hit(a, pkt, since) {
                return verdict;
            }
        }
        Verdict::Pass
    }

    /// Whether an RNR rule makes the responder refuse the SEND `pkt`.
    pub(crate) fn force_rnr(&self, pkt: &Packet, now: u64) -> bool {
        let mut st = self.st.lock();
        let since = now.saturating_sub(st.since);
        st.rules.iter_mut().any(|a| a.rule.action == FaultAction::Rnr && self.hit(a, pkt, since))
    }

    fn hit(&self, a: &mut Armed, pkt: &Packet, since: u64) -> bool {
        if !a.rule.matches(pkt, since) || a.rule.count.is_some_and(|c| a.hits >= c) {
            return false;
        }
        a.seen += 1;
        if a.rule.nth.is_some_and(|n| a.seen != n) || !self.rng.lock().chance(a.rule.p) {
            return false;
        }
        a.hits += 1;
        true
    }

    /// Holds `pkt` back until the next packet of its flow has passed.
    pub(crate) fn hold(&self, pkt: Packet) {
        let flow = (pkt.src_dev, pkt.src_qpn, pkt.dst_qpn);
        self.st.lock().held.push((flow, pkt));
    }

    /// The packets held back on the flow of `pkt`, which has just passed them.
    pub(crate) fn release_after(&self, pkt: &Packet) -> Vec<Packet> {
        let flow = (pkt.src_dev, pkt.src_qpn, pkt.dst_qpn);
        let mut st = self.st.lock();
        if st.held.is_empty() {
            return Vec::new();
        }
        let (mine, rest) = std::mem::take(&mut st.held).into_iter().partition(|(f, _)| *f == flow);
        st.held = rest;
        mine.into_iter().map(|(_, p)| p).collect()
    }

    /// Takes back a held packet whose longest hold is over; `None` if it was released.
    pub(crate) fn take_held(&self, flow: (u32, u32, u32), psn: u32) -> Option<Packet> {
        let mut st = self.st.lock();
        let i = st.held.iter().position(|(f, p)| *f == flow && p.psn == psn)?;
        Some(st.held.remove(i).1)
    }
}

/// A timed rule's moment came.
pub(crate) fn fire_timed(fabric: &FabricInner, generation: u64, index: usize) {
    let action = {
        let mut st = fabric.faults.st.lock();
        if st.generation != generation {
            return;
        }
        let Some(a) = st.rules.get_mut(index) else { return };
        a.hits += 1;
        let bring_up = a.down;
        if let FaultAction::PortDown { .. } = a.rule.action {
            a.down = !a.down;
            if a.down
                && let Some(d) = a.rule.duration
            {
                let job = Job::Fault { generation, rule: index };
                fabric.timer.schedule(fabric.now() + d, job);
            }
        }
        (a.rule.action, a.rule.qp, bring_up)
    };
    let (Some(this), devices) = (fabric.this.upgrade(), &fabric.devices) else { return };
    let device = |dev: u32| {
        devices.get(dev as usize).map(|d| crate::Device { inner: d.clone(), fabric: this.clone() })
    };
    match action {
        (FaultAction::PortDown { dev, port }, _, bring_up) => {
            if let Some(d) = device(dev) {
                let state = if bring_up { PortState::ACTIVE } else { PortState::DOWN };
                let _ = d.set_port_state(port, state);
            }
        }
        (FaultAction::DeviceFatal { dev }, _, _) => {
            if let Some(d) = device(dev) {
                let _ = d.raise_event(EventType::DEVICE_FATAL, None);
                fabric.fail_device_qps(dev);
            }
        }
        (FaultAction::DeviceRemoval { dev }, _, _) => {
            if let Some(d) = device(dev) {
                fabric.cm.device_removed(fabric, dev);
                let _ = d.raise_event(EventType::DEVICE_FATAL, None);
                fabric.fail_device_qps(dev);
            }
        }
        (FaultAction::CqOverrun, Some(qpn), _) => {
            if let Some(qp) = fabric.lookup_qp_any(qpn) {
                qp.send_cq.overrun_now();
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn test_rules_parse_with_their_filters_and_defaults() {
        let r = FaultRule::parse("drop:qp=0x11,op=request,nth=3; delay:op=ack,by=5ms").unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].action, r[0].qp, r[0].nth), (FaultAction::Drop, Some(0x11), Some(3)));
        assert_eq!(r[0].class, Some(PacketClass::Request));
        assert_eq!((r[1].action, r[1].p), (FaultAction::Delay(5_000_000), 1.0));
        let r = FaultRule::parse("partition:a=emu0,b=1,after=10ms,for=200ms").unwrap();
        assert_eq!(
            (r[0].between, r[0].after, r[0].duration),
            (Some((0, 1)), 10_000_000, Some(200_000_000))
        );
        let r = FaultRule::parse("port-down:dev=emu1,for=1s").unwrap();
        assert_eq!(r[0].action, FaultAction::PortDown { dev: 1, port: 1 });
        assert_eq!(FaultRule::parse(" ; ").unwrap(), vec![]);
    }

    #[test]
    fn test_bad_rules_are_refused_with_einval() {
        for bad in [
            "explode",
            "drop:p=2",
            "drop:qp=zz",
            "drop:op=teleport",
            "delay:by=5parsecs",
            "drop:nth=0",
            "partition:a=emu0",
            "partition",
            "port-down",
            "cq-overrun",
            "drop:colour=red",
            "drop:qp",
        ] {
            let e = FaultRule::parse(bad).unwrap_err();
            assert!(e.0.contains(bad.split(':').next().unwrap()), "{bad}: {e}");
            assert_eq!(crate::Error::from(e).errno(), crate::Errno::EINVAL);
        }
    }

    #[test]
    fn test_the_generator_is_fixed_for_a_seed() {
        let mut a = Rng::new(7);
        let first: Vec<u64> = (0..3).map(|_| a.next_u64()).collect();
        let mut b = Rng::new(7);
        assert_eq!(first, (0..3).map(|_| b.next_u64()).collect::<Vec<_>>());
        // SplitMix64's published first output for seed 0.
        assert_eq!(Rng::new(0).next_u64(), 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn test_nth_count_and_probability_select_packets() {
        let f = Faults::new(1);
        let rules = FaultRule::parse("drop:op=send,nth=2; dup:op=write,count=1").unwrap();
        f.st.lock().rules = rules.into_iter().map(Armed::new).collect();
        let send = Packet::new(Kind::Send);
        let write = Packet::new(Kind::Write);
        let got: Vec<_> = (0..3).map(|_| f.judge(&send, 0)).collect();
        assert_eq!(got, [Verdict::Pass, Verdict::Drop, Verdict::Pass]);
        assert_eq!(f.judge(&write, 0), Verdict::Duplicate);
        assert_eq!(f.judge(&write, 0), Verdict::Pass);
        assert_eq!(f.hits(), [1, 1]);
        let half = Faults::new(3);
        half.st.lock().rules = vec![Armed::new(FaultRule::parse("drop:p=0.5").unwrap().remove(0))];
        let drops = (0..1000).filter(|_| half.judge(&send, 0) == Verdict::Drop).count();
        assert!((400..600).contains(&drops), "{drops}");
    }
}
