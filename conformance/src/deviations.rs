//! Deviations as data: where the emulator differs from rxe on purpose, `conformance/deviations.txt`
//! says which programs and call, what rxe prints, what the emulator prints, why, and the reference.
//!
//! ```text
//! [mw-type1-write-past-window]
//! programs = mw_type1_*
//! call = poll cq0
//! rxe = wc qa wr=3 SUCCESS op=WRITE
//! emu = wc qa wr=3 REM_ACCESS_ERR
//! why = remote access through a window is bounded by the window
//! ref = IBA 1.4 10.6.7.2
//! ```
//!
//! `then = continue` marks a difference after which both sides are in the same state: the
//! comparison goes on past it instead of stopping there.
//!
//! `alike = GLOB` names a call both sides print the same (its first line) that leaves them
//! holding different state (rxe queued a WR its call reported failed): the comparison goes on,
//! and a later difference nothing else explains is this deviation's.
//!
//! `programs` and `call` may be given more than once (any of them matches). `*` matches any
//! run of characters, `?` any one character. A deviation explains a pair of differing blocks
//! (the same call, see [`crate::trace::Block`]) when the program and call match and, once the
//! lines only one side prints are set aside (`rxe_only =` / `emu_only =`, detail lines; the
//! count a `poll` or `events` prints is then not compared), every line that still differs
//! matches an `rxe =` / `emu =` pair of it, position by position.

/// One documented difference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deviation {
    pub id: String,
    /// The programs it may explain (any of these globs).
    pub programs: Vec<String>,
    /// The calls it may explain (any of these globs).
    pub call: Vec<String>,
    pub rxe: Vec<String>,
    pub emu: Vec<String>,
    pub rxe_only: Vec<String>,
    pub emu_only: Vec<String>,
    /// Calls printed alike on both sides after which their states differ (`alike =`).
    pub alike: Vec<String>,
    pub why: String,
    pub reference: String,
    /// `then = continue`: the difference leaves both sides in the same state (a failed call
    /// failed on both, an event counted differently), so the calls after it are compared too.
    pub continues: bool,
}

/// Parses the deviations file; every entry needs each key, and as many `rxe` as `emu` lines.
pub fn parse(text: &str) -> Result<Vec<Deviation>, String> {
    let mut out: Vec<Deviation> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = || format!("deviations line {}: {raw}", i + 1);
        if let Some(id) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            if out.iter().any(|d| d.id == id) {
                return Err(format!("{}: a second entry {id}", at()));
            }
            out.push(Deviation {
                id: id.to_string(),
                programs: Vec::new(),
                call: Vec::new(),
                rxe: Vec::new(),
                emu: Vec::new(),
                rxe_only: Vec::new(),
                emu_only: Vec::new(),
                alike: Vec::new(),
                why: String::new(),
                reference: String::new(),
                continues: false,
            });
            continue;
        }
        let (key, value) =
            line.split_once(" = ").ok_or_else(|| format!("{}: not `key = value`", at()))?;
        let d = out.last_mut().ok_or_else(|| format!("{}: before the first [entry]", at()))?;
        let value = value.trim().to_string();
        match key.trim() {
            "programs" => d.programs.push(value),
            "call" => d.call.push(value),
            "rxe" => d.rxe.push(value),
            "emu" => d.emu.push(value),
            "rxe_only" => d.rxe_only.push(value),
            "emu_only" => d.emu_only.push(value),
            "alike" => d.alike.push(value),
            "why" => d.why = value,
            "ref" => d.reference = value,
            "then" if value == "continue" => d.continues = true,
            other => return Err(format!("{}: unknown key {other}", at())),
        }
    }
    for d in &out {
        if d.programs.is_empty() || d.call.is_empty() || d.why.is_empty() || d.reference.is_empty()
        {
            return Err(format!("deviation {} needs programs, call, why and ref", d.id));
        }
        if d.rxe.len() != d.emu.len() {
            return Err(format!("deviation {} needs as many rxe as emu lines", d.id));
        }
        if d.rxe.is_empty() && d.rxe_only.is_empty() && d.emu_only.is_empty() && d.alike.is_empty()
        {
            return Err(format!("deviation {} names no line", d.id));
        }
    }
    Ok(out)
}

impl Deviation {
    /// Whether this deviation explains the differing blocks `rxe` and `emu` (each as
    /// [`crate::trace::Block::lines`], detail lines without their indentation) of `program`.
    pub fn explains(&self, program: &str, call: &str, rxe: &[String], emu: &[String]) -> bool {
        if !self.programs.iter().any(|p| glob(p, program))
            || !self.call.iter().any(|c| glob(c, call))
        {
            return false;
        }
        let only = !self.rxe_only.is_empty() || !self.emu_only.is_empty();
        let keep = |lines: &[String], drop: &[String]| -> Vec<String> {
            lines
                .iter()
                .enumerate()
                .filter(|(i, l)| *i == 0 || !drop.iter().any(|g| glob(g, l.trim())))
                .map(|(i, l)| if i == 0 && only { uncounted(l) } else { l.trim().to_string() })
                .collect()
        };
        let (rxe, emu) = (keep(rxe, &self.rxe_only), keep(emu, &self.emu_only));
        rxe.len() == emu.len()
            && rxe.iter().zip(&emu).filter(|(r, e)| r != e).all(|(r, e)| {
                (0..self.rxe.len()).any(|j| glob(&self.rxe[j], r) && glob(&self.emu[j], e))
            })
    }

    /// Whether `block`, printed alike by both sides of `program`, is a call this deviation's
    /// `alike` names: the sides' states differ from there on.
    pub fn leaves_states_apart(&self, program: &str, block: &crate::trace::Block) -> bool {
        !self.alike.is_empty()
            && self.programs.iter().any(|p| glob(p, program))
            && self.call.iter().any(|c| glob(c, block.call()))
            && self.alike.iter().any(|g| glob(g, &block.line))
    }
}

/// A call line without the count it printed (`poll cq0 => 3` -> `poll cq0 => #`).
fn uncounted(line: &str) -> String {
    match line.rsplit_once(" => ") {
        Some((call, n)) if n.parse::<u32>().is_ok() => format!("{call} => #"),
        _ => line.to_string(),
    }
}

/// `*` matches any run of characters, `?` any one character; everything else matches itself.
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut i, mut j) = (0, 0);
    // Where the last `*` was, and where in the text it is tried next: one backtrack point
    // suffices, since a later `*` can absorb anything an earlier one would.
    let mut star: Option<(usize, usize)> = None;
    while j < t.len() {
        if i < p.len() && (p[i] == '?' || (p[i] != '*' && p[i] == t[j])) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some((i, j));
            i += 1;
        } else if let Some((si, sj)) = star {
            star = Some((si, sj + 1));
            i = si + 1;
            j = sj + 1;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("a*c", "abbbc"));
        assert!(glob("*", ""));
        assert!(glob("poll *", "poll cq0"));
        assert!(!glob("poll *", "pd pd0"));
        assert!(glob("a*b*c", "a-b-c"));
        assert!(!glob("a*b*c", "a-c-b"));
        assert!(glob("exact", "exact"));
        assert!(!glob("exact", "exactly"));
        assert!(glob("wr=10??", "wr=1001"));
        assert!(!glob("wr=10??", "wr=10"));
        assert!(!glob("wr=10??", "wr=10011"));
        assert!(glob("*a?", "xxaab"));
    }

    const ONE: &str = "[d]\nprograms = mw_*\ncall = poll *\nrxe = wc qa wr=3 SUCCESS op=WRITE\nemu = wc qa wr=3 REM_ACCESS_ERR\nwhy = bounded\nref = IBA\n";

    #[test]
    fn explains_only_the_lines_it_names() {
        let d = &parse(ONE).unwrap()[0];
        let rxe = ["poll cq0 => 1".to_string(), "  wc qa wr=3 SUCCESS op=WRITE".into()];
        let emu = ["poll cq0 => 1".to_string(), "  wc qa wr=3 REM_ACCESS_ERR".into()];
        assert!(d.explains("mw_a", "poll cq0", &rxe, &emu));
        assert!(!d.explains("other", "poll cq0", &rxe, &emu));
        let emu2 = ["poll cq0 => 1".to_string(), "  wc qa wr=3 LOC_LEN_ERR".into()];
        assert!(!d.explains("mw_a", "poll cq0", &rxe, &emu2));
        assert!(!d.explains("mw_a", "poll cq0", &rxe, &emu[..1]));
    }

    #[test]
    fn lines_one_side_only() {
        let d = &parse("[f]\nprograms = *\ncall = poll *\nemu_only = wc * wr=10?? WR_FLUSH_ERR\nwhy = w\nref = r\n").unwrap()[0];
        let rxe = ["poll cq0 => 1".to_string(), "  wc qa wr=1 SUCCESS op=SEND".into()];
        let emu = [
            "poll cq0 => 2".to_string(),
            "  wc qa wr=1 SUCCESS op=SEND".into(),
            "  wc qa wr=1001 WR_FLUSH_ERR".into(),
        ];
        assert!(d.explains("p", "poll cq0", &rxe, &emu));
        let other = [
            "poll cq0 => 2".to_string(),
            "  wc qa wr=1 SUCCESS op=SEND".into(),
            "  wc qa wr=5 WR_FLUSH_ERR".into(),
        ];
        assert!(!d.explains("p", "poll cq0", &rxe, &other));
        // A send numbered 10 is not a receive (live run, seed 75013).
        let send_10 = [
            "poll cq0 => 3".to_string(),
            "  wc qa wr=9 WR_FLUSH_ERR".into(),
            "  wc qa wr=10 WR_FLUSH_ERR".into(),
            "  wc qa wr=1001 WR_FLUSH_ERR".into(),
        ];
        let rxe_10 = ["poll cq0 => 2".to_string(), send_10[1].clone(), send_10[2].clone()];
        assert!(d.explains("p", "poll cq0", &rxe_10, &send_10));
    }

    #[test]
    fn refuses_incomplete_entries() {
        assert!(parse("[d]\nprograms = *\n").is_err());
        assert!(parse("programs = *\n").is_err());
        assert!(parse(&ONE.replace("emu = ", "# ")).is_err());
        assert!(parse(&format!("{ONE}{ONE}")).unwrap_err().contains("second"));
    }
}
