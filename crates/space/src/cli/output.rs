//! What client commands share that is not the commands themselves: parsing a sandbox
//! ID from the command line and printing tables and JSON (a leaf: it uses no command
//! module).

use std::io::Write as _;

use space_identity::SandboxId;

use super::errors;

/// A sandbox ID from the command line.
pub(crate) fn sandbox_id(id: &str) -> Result<SandboxId, String> {
    id.parse().map_err(|_| errors::no_such_sandbox())
}

/// Prints rows as aligned columns.
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        parts.join("  ").trim_end().to_owned()
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "{}",
        line(headers.iter().map(|h| h.to_string()).collect())
    );
    for r in rows {
        let _ = writeln!(out, "{}", line(r.clone()));
    }
}

pub(crate) fn print_json(v: &impl serde::Serialize) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}
