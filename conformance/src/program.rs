//! Verb programs: a name and a list of calls, one per line, in the runner's language
//! (`docs/conformance.md`). Scenario files (`conformance/scenarios/*.verbs`) hold several, each
//! between `program NAME` and `end`; `#` starts a comment line.

use std::fmt;

/// One verb program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    /// Unique within its file; deviations select programs by it.
    pub name: String,
    /// The calls, each as the runner reads it (`post_send qa SEND wr=1 sge=mr0:0:64`).
    pub calls: Vec<String>,
}

impl Program {
    /// The program as the runner reads it.
    pub fn text(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "program {}", self.name)?;
        for call in &self.calls {
            writeln!(f, "{call}")?;
        }
        writeln!(f, "end")
    }
}

/// The text of several programs, as the runner reads them.
pub fn text_of(programs: &[Program]) -> String {
    programs.iter().map(Program::text).collect()
}

/// Parses a scenario file. Errors name the line.
pub fn parse(text: &str) -> Result<Vec<Program>, String> {
    let mut programs = Vec::new();
    let mut current: Option<Program> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split_whitespace().collect::<Vec<_>>().join(" ");
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = || format!("line {}: {raw}", i + 1);
        if let Some(name) = line.strip_prefix("program ") {
            if current.is_some() {
                return Err(format!("{}: `program` inside a program", at()));
            }
            if programs.iter().any(|p: &Program| p.name == name) {
                return Err(format!("{}: a second program named {name}", at()));
            }
            current = Some(Program { name: name.to_string(), calls: Vec::new() });
        } else if line == "end" {
            programs
                .push(current.take().ok_or_else(|| format!("{}: `end` outside a program", at()))?);
        } else {
            current
                .as_mut()
                .ok_or_else(|| format!("{}: a call outside a program", at()))?
                .calls
                .push(line);
        }
    }
    match current {
        Some(p) => Err(format!("program {} has no `end`", p.name)),
        None => Ok(programs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_it_prints() {
        let text = "# a comment\nprogram a\npd  pd0\nend\n\nprogram b\nend\n";
        let programs = parse(text).unwrap();
        assert_eq!(programs.len(), 2);
        assert_eq!(programs[0].calls, ["pd pd0"]);
        assert_eq!(parse(&text_of(&programs)).unwrap(), programs);
    }

    #[test]
    fn refuses_broken_files() {
        assert!(parse("pd pd0\n").unwrap_err().contains("line 1"));
        assert!(parse("program a\n").unwrap_err().contains("no `end`"));
        assert!(parse("program a\nend\nprogram a\nend\n").unwrap_err().contains("second"));
        assert!(parse("end\n").is_err());
    }
}
