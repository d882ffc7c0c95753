//! Comparing an emulator trace with the rxe trace of the same program.
//!
//! Blocks are compared in order. The first block that differs decides: either a deviation
//! explains it, or the program fails there. What follows a documented difference is its
//! consequence (a WR that fails on one side leaves that QP in ERR, and every later completion
//! differs), so it is not compared further. A call both sides printed alike may still have left
//! them apart (a deviation's `alike`): a later difference nothing else explains is then that
//! deviation's.

use crate::deviations::Deviation;
use crate::trace::Trace;

/// How one program compared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Equal,
    /// The first difference is the documented deviation with this id.
    Explained(String),
    /// An unexplained difference at block `block` (0-based), with both sides' lines.
    Differs {
        block: usize,
        rxe: Vec<String>,
        emu: Vec<String>,
    },
}

/// Compares the emulator's trace of a program with rxe's. A deviation marked `then =
/// continue` lets the comparison go on; the program's outcome is then the first deviation's,
/// unless a later difference is unexplained.
pub fn compare(rxe: &Trace, emu: &Trace, deviations: &[Deviation]) -> Outcome {
    let n = rxe.blocks.len().max(emu.blocks.len());
    let mut first: Option<String> = None;
    // The `alike` deviation whose call has left the sides apart, if one has.
    let mut apart: Option<&Deviation> = None;
    for i in 0..n {
        let (r, e) = (rxe.blocks.get(i), emu.blocks.get(i));
        if r == e {
            if apart.is_none()
                && let Some(b) = r
            {
                apart = deviations.iter().find(|d| d.leaves_states_apart(&rxe.program, b));
            }
            continue;
        }
        let lines = |b: Option<&crate::trace::Block>| b.map(|b| b.lines()).unwrap_or_default();
        let (rl, el) = (lines(r), lines(e));
        let call = r.or(e).map(|b| b.call().to_string()).unwrap_or_default();
        let Some(d) = deviations.iter().find(|d| d.explains(&rxe.program, &call, &rl, &el)) else {
            return match apart {
                Some(d) => Outcome::Explained(first.unwrap_or_else(|| d.id.clone())),
                None => Outcome::Differs { block: i, rxe: rl, emu: el },
            };
        };
        let id = first.get_or_insert_with(|| d.id.clone()).clone();
        if !d.continues {
            return Outcome::Explained(id);
        }
    }
    first.map_or(Outcome::Equal, Outcome::Explained)
}

/// The score of a comparison run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Score {
    pub compared: usize,
    pub equal: usize,
    pub explained: usize,
    pub failed: usize,
}

impl Score {
    pub fn add(&mut self, outcome: &Outcome) {
        self.compared += 1;
        match outcome {
            Outcome::Equal => self.equal += 1,
            Outcome::Explained(_) => self.explained += 1,
            Outcome::Differs { .. } => self.failed += 1,
        }
    }
}

/// A readable account of one failure: the program's calls up to the difference and both sides.
pub fn describe(rxe: &Trace, outcome: &Outcome) -> String {
    let Outcome::Differs { block, rxe: r, emu: e } = outcome else { return String::new() };
    let mut s = format!("program {} differs at call {}:\n", rxe.program, block + 1);
    for b in rxe.blocks.iter().take(*block) {
        for l in b.lines() {
            s.push_str(&format!("    {l}\n"));
        }
    }
    s.push_str("  rxe:\n");
    for l in r {
        s.push_str(&format!("    {l}\n"));
    }
    s.push_str("  emulator:\n");
    for l in e {
        s.push_str(&format!("    {l}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::parse;

    fn one(text: &str) -> Trace {
        parse(text).unwrap().remove(0)
    }

    #[test]
    fn the_first_difference_decides() {
        let rxe =
            one("program mw_a\npd pd0 => ok\npoll cq0 => 1\n  wc qa wr=3 SUCCESS op=WRITE\nend\n");
        let emu =
            one("program mw_a\npd pd0 => ok\npoll cq0 => 1\n  wc qa wr=3 REM_ACCESS_ERR\nend\n");
        assert_eq!(compare(&rxe, &rxe, &[]), Outcome::Equal);
        let Outcome::Differs { block, .. } = compare(&rxe, &emu, &[]) else { panic!() };
        assert_eq!(block, 1);
        let devs = crate::deviations::parse(
            "[d]\nprograms = mw_*\ncall = poll *\nrxe = wc qa wr=3 SUCCESS op=WRITE\nemu = wc qa wr=3 REM_ACCESS_ERR\nwhy = w\nref = r\n",
        )
        .unwrap();
        assert_eq!(compare(&rxe, &emu, &devs), Outcome::Explained("d".into()));
        let later = one(
            "program mw_a\npd pd0 => ok\npoll cq0 => 1\n  wc qa wr=3 REM_ACCESS_ERR\npd pd1 => EBUSY\nend\n",
        );
        let rxe_later = one(
            "program mw_a\npd pd0 => ok\npoll cq0 => 1\n  wc qa wr=3 SUCCESS op=WRITE\npd pd1 => ok\nend\n",
        );
        assert_eq!(
            compare(&rxe_later, &later, &devs),
            Outcome::Explained("d".into()),
            "stops at d"
        );
        let mut going_on = devs.clone();
        going_on[0].continues = true;
        assert!(matches!(
            compare(&rxe_later, &later, &going_on),
            Outcome::Differs { block: 2, .. }
        ));
        assert_eq!(compare(&rxe, &emu, &going_on), Outcome::Explained("d".into()));
        let cut = one("program mw_a\npd pd0 => ok\n");
        assert!(matches!(compare(&rxe, &cut, &devs), Outcome::Differs { block: 1, .. }));
    }

    #[test]
    fn a_call_printed_alike_can_leave_the_sides_apart() {
        let devs = crate::deviations::parse(
            "[queued]\nprograms = *\ncall = bind_mw *\nalike = * => EINVAL\nwhy = w\nref = r\n",
        )
        .unwrap();
        let bind = "program p\nbind_mw mw0 qa mr0 0 64 RW wr=1 => EINVAL\nmodify qa ERR => ok\n";
        let rxe = one(&format!("{bind}poll cq0 => 1\n  wc qa wr=1 WR_FLUSH_ERR\nend\n"));
        let emu = one(&format!("{bind}poll cq0 => 0\nend\n"));
        assert!(matches!(compare(&rxe, &emu, &[]), Outcome::Differs { block: 2, .. }));
        assert_eq!(compare(&rxe, &emu, &devs), Outcome::Explained("queued".into()));
        // Nothing differs later: the program is equal.
        assert_eq!(compare(&rxe, &rxe, &devs), Outcome::Equal);
        // A bind that succeeded leaves nothing apart.
        let ok = |t: &Trace| one(&t.text().replace("=> EINVAL", "=> ok"));
        assert!(matches!(compare(&ok(&rxe), &ok(&emu), &devs), Outcome::Differs { .. }));
    }
}
