//! The chart `ratios` writes: each goal's median ratio against its target, as horizontal bars
//! on a log scale where the target is 1 (right of the line: met).

use std::fmt::Write;

/// One bar: the label, the median ratio and the target as the table prints it
/// (`>= 0.25x`, `<= 2.0x`, or no target).
pub(crate) struct Bar {
    pub(crate) label: String,
    pub(crate) ratio: f64,
    pub(crate) target: String,
}

/// How far the ratio is toward its target (1 = met, above 1 = better), if it has one.
fn progress(ratio: f64, target: &str) -> Option<f64> {
    let t: f64 =
        target.trim_start_matches(['>', '<', '=', ' ']).trim_end_matches('x').parse().ok()?;
    if target.starts_with(">=") {
        Some(ratio / t)
    } else if target.starts_with("<=") {
        Some(t / ratio)
    } else {
        None
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The chart, as an SVG document.
pub(crate) fn chart(title: &str, bars: &[Bar]) -> String {
    let (label_w, plot_w, row_h, top) = (520.0, 420.0, 22.0, 50.0);
    let height = top + row_h * bars.len() as f64 + 40.0;
    // log10 of progress from 1/100 to 10, the target at 1.
    let x = |p: f64| label_w + (p.clamp(0.01, 10.0).log10() + 2.0) / 3.0 * plot_w;
    let mut s = String::new();
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="10" y="20" font-size="14" font-weight="bold">{title}</text>
<text x="{label_w}" y="40" fill="#555">ratio / target, log scale: left of the line misses the goal, right meets it</text>
"##,
        w = label_w + plot_w + 120.0,
        title = escape(title),
    );
    for (p, tick) in [(0.01, "1/100"), (0.1, "1/10"), (1.0, "goal"), (10.0, "10x")] {
        let _ = writeln!(
            s,
            r##"<line x1="{0}" y1="{top}" x2="{0}" y2="{1}" stroke="{2}" stroke-width="{3}"/><text x="{0}" y="{4}" text-anchor="middle" fill="#555">{tick}</text>"##,
            x(p),
            height - 30.0,
            if p == 1.0 { "#000" } else { "#ccc" },
            if p == 1.0 { 2 } else { 1 },
            height - 15.0,
        );
    }
    for (i, b) in bars.iter().enumerate() {
        let y = top + row_h * i as f64;
        let _ = write!(s, r#"<text x="10" y="{}">{}</text>"#, y + 15.0, escape(&b.label));
        let text = format!("{:.3}x (goal {})", b.ratio, escape(&b.target));
        match progress(b.ratio, &b.target) {
            Some(p) => {
                let colour = if p >= 1.0 { "#2e7d32" } else { "#c62828" };
                let _ = writeln!(
                    s,
                    r#"<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="{colour}"/><text x="{tx}" y="{ty}">{text}</text>"#,
                    x0 = x(0.01),
                    y0 = y + 4.0,
                    w = x(p) - x(0.01),
                    h = row_h - 8.0,
                    tx = x(p) + 4.0,
                    ty = y + 15.0,
                );
            }
            None => {
                let _ = writeln!(
                    s,
                    r##"<text x="{}" y="{}" fill="#555">{:.3}x (no goal)</text>"##,
                    x(0.01),
                    y + 15.0,
                    b.ratio
                );
            }
        }
    }
    s.push_str("</svg>\n");
    s
}
