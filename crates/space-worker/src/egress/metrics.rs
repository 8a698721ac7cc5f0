//! The egress counters of every sandbox with a link, in the Prometheus text format
//! (appended to the worker's `/metrics`, before its `# EOF`).

use std::fmt::Write as _;
use std::sync::Arc;

use super::tenant::Tenant;

/// A label value with `\`, `"` and newlines escaped.
fn label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// The metrics of `tenants` (sorted by sandbox, so scrapes compare line by line).
pub fn render(tenants: &[Arc<Tenant>]) -> String {
    let mut rows: Vec<(String, super::tenant::CounterSnapshot)> = tenants
        .iter()
        .map(|t| (t.sandbox().to_string(), t.counters()))
        .collect();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = String::new();
    out.push_str(
        "# HELP space_worker_egress_connections Connections a sandbox opened through the \
         egress proxy, by sandbox and protocol.\n# TYPE space_worker_egress_connections counter\n",
    );
    for (s, c) in &rows {
        for (via, n) in [("http", c.http_connections), ("tls", c.tls_connections)] {
            let _ = writeln!(
                out,
                "space_worker_egress_connections_total{{sandbox=\"{s}\",via=\"{via}\"}} {n}"
            );
        }
    }
    out.push_str(
        "# HELP space_worker_egress_dns_questions DNS questions a sandbox asked the \
         platform's resolver.\n# TYPE space_worker_egress_dns_questions counter\n",
    );
    for (s, c) in &rows {
        let _ = writeln!(
            out,
            "space_worker_egress_dns_questions_total{{sandbox=\"{s}\"}} {}",
            c.dns_questions
        );
    }
    out.push_str(
        "# HELP space_worker_egress_bytes Bytes through the egress proxy, by sandbox and \
         direction.\n# TYPE space_worker_egress_bytes counter\n",
    );
    for (s, c) in &rows {
        for (direction, n) in [("out", c.bytes_out), ("in", c.bytes_in)] {
            let _ = writeln!(
                out,
                "space_worker_egress_bytes_total{{sandbox=\"{s}\",direction=\"{direction}\"}} {n}"
            );
        }
    }
    out.push_str(
        "# HELP space_worker_egress_refusals Connections and DNS questions the egress \
         policy refused, by sandbox, layer and rule.\n# TYPE space_worker_egress_refusals counter\n",
    );
    for (s, c) in &rows {
        for ((layer, rule), n) in &c.refusals {
            let _ = writeln!(
                out,
                "space_worker_egress_refusals_total{{sandbox=\"{s}\",layer=\"{layer}\",rule=\"{}\"}} {n}",
                label(rule)
            );
        }
    }
    out
}

/// `registry` text with `extra` inserted before its closing `# EOF` line.
pub fn splice(mut registry: String, extra: &str) -> String {
    match registry.rfind("# EOF") {
        Some(at) => registry.insert_str(at, extra),
        None => registry.push_str(extra),
    }
    registry
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_with_quotes_cannot_break_out_of_its_label() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn egress_lines_go_before_the_end_marker() {
        let out = splice("x 1\n# EOF\n".into(), "y 2\n");
        assert_eq!(out, "x 1\ny 2\n# EOF\n");
    }
}
