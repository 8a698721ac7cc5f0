//! Crash points: a test facility that does nothing unless the process was started
//! with `SPACE_CRASH_AT` set. [`crash_point`] then sends SIGKILL to its own process
//! at the named line — exactly a `kill -9` there: no destructor runs, nothing is
//! flushed. Names are `&'static str` at the call sites and the variable is read from
//! the process environment once (at the first crash point reached), so no request
//! can name, arm or trigger one.
//!
//! `SPACE_CRASH_AT=<name>[,<name>…]` kills at every arrival at a listed point.
//! `SPACE_CRASH_AT=<name>[,<name>…]@<dir>` kills only by consuming the file
//! `<dir>/<name>` (the one process whose unlink succeeds dies, once per file): a test
//! arms a point by creating that file, so a process restarted with the same
//! environment (a supervised worker) runs normally afterwards.

use std::path::PathBuf;
use std::sync::OnceLock;

/// The environment variable naming the crash points.
pub const CRASH_AT_ENV: &str = "SPACE_CRASH_AT";

/// The points listed in the variable, and the directory of their one-shot files.
static ARMED: OnceLock<Option<(Vec<String>, Option<PathBuf>)>> = OnceLock::new();

fn parse(value: &str) -> (Vec<String>, Option<PathBuf>) {
    let (names, dir) = match value.split_once('@') {
        Some((names, dir)) => (names, Some(PathBuf::from(dir))),
        None => (value, None),
    };
    let names = names
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    (names, dir)
}

/// Dies by SIGKILL here if `name` is armed (see the module); otherwise returns at
/// once (one atomic load when the variable is not set).
pub fn crash_point(name: &'static str) {
    let armed = ARMED.get_or_init(|| std::env::var(CRASH_AT_ENV).ok().map(|v| parse(&v)));
    let Some((names, dir)) = armed else {
        return;
    };
    if !names.iter().any(|n| n == name) {
        return;
    }
    if let Some(dir) = dir {
        // Unlink is atomic: of several processes reaching the point, one consumes it.
        if std::fs::remove_file(dir.join(name)).is_err() {
            return;
        }
    }
    eprintln!("crash point {name}: SIGKILL");
    let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
}
