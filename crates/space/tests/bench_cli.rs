//! `space bench` from the command line: the table's rows as JSON, and the exit code.

use std::process::Command;

fn space() -> Command {
    Command::new(env!("CARGO_BIN_EXE_space"))
}

#[test]
fn bench_p2_prints_json_rows_with_target_ratio_and_verdict() {
    let out = space().args(["--json", "bench", "p2"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in &rows {
        assert_eq!(r["id"], "P2");
        assert!(r["measured"].as_str().is_some_and(|m| !m.is_empty()));
        assert!(
            r["target"]
                .as_str()
                .is_some_and(|t| t.starts_with('≤') || t.starts_with('≥'))
        );
        assert!(r["ratio"].as_f64().is_some_and(|x| x > 0.0), "{r}");
        assert!(r["pass"].is_boolean(), "{r}");
    }
    // The progress line goes to stderr, never into the table.
    assert!(String::from_utf8_lossy(&out.stderr).contains("P2:"));
}

#[test]
fn an_unknown_figure_is_refused() {
    let out = space().args(["bench", "p12"]).output().unwrap();
    assert!(!out.status.success());
}
