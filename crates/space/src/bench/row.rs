//! A benchmark table: its rows, how it prints, and the quantile its cells are made of.

use serde::Serialize;

/// One row of a benchmark table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The figure's name in `QUALITY.md` (`P3`, `P9`, …) or a short name.
    pub id: String,
    /// What was measured.
    pub what: String,
    /// The measured value, with its unit.
    pub measured: String,
    /// The target, as `QUALITY.md` states it.
    pub target: String,
    /// Measured over the target's anchor, where the target is a ratio or a bound.
    pub ratio: Option<f64>,
    /// Whether the target was met (`None`: no target, information only).
    pub pass: Option<bool>,
}

impl Row {
    /// A row.
    pub fn new(id: &str, what: &str, measured: String, target: &str) -> Self {
        Self {
            id: id.to_owned(),
            what: what.to_owned(),
            measured,
            target: target.to_owned(),
            ratio: None,
            pass: None,
        }
    }

    /// With the ratio of measured to target.
    pub fn ratio(mut self, ratio: f64) -> Self {
        self.ratio = Some(ratio);
        self
    }

    /// With the verdict.
    pub fn pass(mut self, pass: bool) -> Self {
        self.pass = Some(pass);
        self
    }
}

/// Prints `rows` as an aligned table (or JSON lines with `json`).
pub fn print_table(rows: &[Row], json: bool) {
    if json {
        for r in rows {
            println!("{}", serde_json::to_string(r).unwrap_or_default());
        }
        return;
    }
    let head = ["id", "what", "measured", "target", "ratio", "pass"];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.id.clone(),
                r.what.clone(),
                r.measured.clone(),
                r.target.clone(),
                r.ratio.map_or_else(|| "-".into(), |x| format!("{x:.2}")),
                match r.pass {
                    Some(true) => "yes".into(),
                    Some(false) => "NO".into(),
                    None => "-".into(),
                },
            ]
        })
        .collect();
    let mut width = head.map(str::len);
    for c in &cells {
        for (w, s) in width.iter_mut().zip(c) {
            *w = (*w).max(s.chars().count());
        }
    }
    let line = |c: &[String]| {
        let mut out = String::new();
        for (i, (s, w)) in c.iter().zip(width).enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            out.push_str(s);
            out.extend(std::iter::repeat_n(
                ' ',
                w.saturating_sub(s.chars().count()),
            ));
        }
        println!("{}", out.trim_end());
    };
    line(&head.map(str::to_owned));
    for c in &cells {
        line(c);
    }
}

/// The `p`-quantile of sorted `values` (nearest rank), or 0 when empty.
pub fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}
