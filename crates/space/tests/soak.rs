//! The churn soak's short form (`space bench soak`): sandboxes migrate and pause back
//! to back while clients read, write, exec and open streams through the edge and in the
//! SDK's direct mode. It must see no failed operation, no wrong delivery, no lost write
//! and no dropped connection.

use std::process::Command;

use space_testkit::cluster as support;

fn soak(env: &[(&str, &str)], args: &[&str]) -> (bool, String, String) {
    let out = Command::new(support::space_bin())
        .args(["--json", "bench", "soak"])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("space bench soak runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), stdout, stderr)
}

/// The row of `what` in the soak's JSON rows.
fn row<'a>(rows: &'a [serde_json::Value], what: &str) -> &'a serde_json::Value {
    rows.iter()
        .find(|r| r["what"].as_str().is_some_and(|w| w.starts_with(what)))
        .unwrap_or_else(|| panic!("no row {what:?} in {rows:?}"))
}

fn rows(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[test]
fn operations_through_the_edge_and_the_sdk_never_fail_while_sandboxes_migrate_and_pause_back_to_back()
 {
    if !support::can_run_jails() {
        return;
    }
    let (ok, stdout, stderr) = soak(&[], &["--duration", "10", "--min-migrations", "20"]);
    let rows = rows(&stdout);
    assert!(
        ok,
        "the soak missed a target:\n{stdout}\n--- stderr (last lines) ---\n{}",
        tail(&stderr, 60)
    );
    for what in [
        "wrong-execution deliveries",
        "cross-sandbox deliveries",
        "acknowledged writes lost",
        "dropped non-stream connections",
    ] {
        assert_eq!(row(&rows, what)["measured"], "0", "{what}: {stdout}");
    }
    let failed = row(&rows, "failed operations per million");
    assert!(
        failed["measured"]
            .as_str()
            .is_some_and(|m| m.starts_with("0.00 (0 failed)")),
        "{stdout}"
    );
    let churn = row(&rows, "lifecycle churn");
    let migrations: u64 = churn["measured"]
        .as_str()
        .and_then(|m| m.split(" / ").next())
        .and_then(|n| n.parse().ok())
        .expect("migrations");
    assert!(migrations >= 20, "{stdout}");
}

/// The soak can fail: with resolves that answer at once during a transition (the
/// behaviour before they waited for the next execution), operations fail.
#[test]
fn the_soak_fails_when_a_resolve_does_not_wait_for_the_next_execution() {
    if !support::can_run_jails() {
        return;
    }
    let (ok, stdout, _) = soak(
        &[("SPACE_TRANSITION_WAIT_MS", "0")],
        &["--duration", "5", "--min-migrations", "20"],
    );
    assert!(!ok, "the soak passed without the wait:\n{stdout}");
    let rows = rows(&stdout);
    assert_eq!(
        row(&rows, "failed operations per million")["pass"],
        false,
        "{stdout}"
    );
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
