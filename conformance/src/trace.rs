//! Traces as the runner prints them: per program, one block per call (the call echoed with its
//! result after ` => `, then indented lines: completions, events, cleanup failures).

use crate::program::Program;

/// One call and what it produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// The call as echoed, with its result: `dealloc_pd pd0 => EBUSY`.
    pub line: String,
    /// The indented lines under it, without their indentation.
    pub details: Vec<String>,
}

impl Block {
    /// The call without its result.
    pub fn call(&self) -> &str {
        self.line.split(" => ").next().unwrap_or(&self.line)
    }

    /// The block as lines: the call line, then each detail line indented.
    pub fn lines(&self) -> Vec<String> {
        std::iter::once(self.line.clone())
            .chain(self.details.iter().map(|d| format!("  {d}")))
            .collect()
    }
}

/// One program's trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    pub program: String,
    /// The calls in order; the last is `end` (whose details are cleanup failures).
    pub blocks: Vec<Block>,
}

impl Trace {
    /// The program this trace ran (the calls it echoes).
    pub fn program(&self) -> Program {
        Program {
            name: self.program.clone(),
            calls: self
                .blocks
                .iter()
                .filter(|b| b.line != "end")
                .map(|b| b.call().to_string())
                .collect(),
        }
    }

    /// Whether the trace ran to its `end` (a runner that died leaves it cut short).
    pub fn complete(&self) -> bool {
        self.blocks.last().is_some_and(|b| b.line == "end")
    }

    /// The trace as the runner printed it.
    pub fn text(&self) -> String {
        let mut s = format!("program {}\n", self.program);
        for b in &self.blocks {
            for l in b.lines() {
                s.push_str(&l);
                s.push('\n');
            }
        }
        s
    }
}

/// Splits the runner's output into traces. Lines before the first `program` are refused.
pub fn parse(text: &str) -> Result<Vec<Trace>, String> {
    let mut traces: Vec<Trace> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if let Some(name) = line.strip_prefix("program ") {
            traces.push(Trace { program: name.to_string(), blocks: Vec::new() });
            continue;
        }
        let Some(trace) = traces.last_mut() else {
            return Err(format!("line {}: output before the first program: {line}", i + 1));
        };
        if let Some(detail) = line.strip_prefix("  ") {
            let Some(block) = trace.blocks.last_mut() else {
                return Err(format!("line {}: a detail line before any call", i + 1));
            };
            block.details.push(detail.to_string());
        } else if !line.is_empty() {
            trace.blocks.push(Block { line: line.to_string(), details: Vec::new() });
        }
    }
    Ok(traces)
}

/// All traces' text.
pub fn text_of(traces: &[Trace]) -> String {
    traces.iter().map(Trace::text).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "program p\npd pd0 => ok\npoll cq0 => 1\n  wc qa wr=1 SUCCESS op=SEND\nend\n  cleanup pd0 => EBUSY\n";

    #[test]
    fn splits_blocks_and_recovers_the_program() {
        let t = parse(OUT).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].blocks.len(), 3);
        assert_eq!(t[0].blocks[1].details, ["wc qa wr=1 SUCCESS op=SEND"]);
        assert_eq!(t[0].blocks[2].details, ["cleanup pd0 => EBUSY"]);
        assert_eq!(t[0].program().calls, ["pd pd0", "poll cq0"]);
        assert!(t[0].complete());
        assert_eq!(text_of(&t), OUT);
    }

    #[test]
    fn a_cut_trace_is_incomplete() {
        let t = parse("program p\npd pd0 => ok\n").unwrap();
        assert!(!t[0].complete());
        assert!(parse("pd pd0 => ok\n").is_err());
    }
}
