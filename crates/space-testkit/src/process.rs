//! Processes of a cross-process test: children stopped on drop, their first line of
//! output, processes found by their arguments or their cgroups, `kill -9`, and the
//! memory they hold.

use std::io::{BufRead, BufReader};
use std::process::{Child, ExitStatus};
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process};

use crate::wait::wait_for;

/// How often a process's exit is polled for.
const EXIT_POLL: Duration = Duration::from_millis(20);

/// A child process killed (SIGKILL) and reaped on drop, also when a test fails.
#[derive(Debug)]
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Stops `child` the way a supervisor does: SIGTERM, up to `grace` for it to exit,
/// then SIGKILL; reaped either way.
pub fn stop(child: &mut Child, grace: Duration) {
    signal(child.id() as i32, Signal::TERM);
    if wait_exit(child, grace).is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Waits up to `limit` for `child` to exit by itself: its exit status, `None` when it
/// still runs.
pub fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    wait_for(limit, EXIT_POLL, || child.try_wait().ok().flatten())
}

/// The first line `child` writes on its (piped) stdout, without its line end; the
/// rest of its output is drained on a thread, so that it never blocks on a full pipe.
pub fn first_line(child: &mut Child) -> String {
    let stdout = child.stdout.take().expect("the child's stdout is piped");
    let mut lines = BufReader::new(stdout).lines();
    let first = lines
        .next()
        .expect("the child wrote a line")
        .expect("the child's first line is text");
    std::thread::spawn(move || for _ in lines {});
    first
}

/// `kill -9 pid`.
pub fn kill9(pid: i32) {
    signal(pid, Signal::KILL);
}

/// Sends `sig` to `pid`; a process that is gone already is no error.
fn signal(pid: i32, sig: Signal) {
    if let Some(pid) = Pid::from_raw(pid) {
        let _ = kill_process(pid, sig);
    }
}

/// Every PID of `/proc` with its arguments.
fn processes() -> Vec<(i32, Vec<String>)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_string_lossy().parse::<i32>().ok()?;
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args = cmd
                .split(|&b| b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            Some((pid, args))
        })
        .collect()
}

/// PIDs of the processes whose command line mentions `needle` anywhere.
pub fn pids_naming(needle: &str) -> Vec<i32> {
    processes()
        .into_iter()
        .filter(|(_, args)| args.join("\0").contains(needle))
        .map(|(pid, _)| pid)
        .collect()
}

/// Every process whose environment holds `entry` (`NAME=value`, exactly): what a
/// process tree was started with reaches every descendant that kept its environment,
/// wherever it was reparented.
pub fn pids_with_env(entry: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|e| e == entry.as_bytes()))
        })
        .collect()
}

/// The PID of a live process (zombies excluded: a killed worker stays one until its
/// supervisor reaps it) each of whose `words` is one of its arguments, or, for a path,
/// the start of one (a data dir names every worker's dir below it). A match whose
/// parent matches too is left out: it is a child forked and not yet exec'd (it still
/// shows its parent's arguments for a moment, then becomes another program or exits).
pub fn find_pid(words: &[&str]) -> Option<i32> {
    let found: Vec<i32> = processes()
        .into_iter()
        .filter_map(|(pid, args)| {
            let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|st| st.contains(") Z "));
            let matches = |w: &&str| {
                args.iter()
                    .any(|a| a == w || (w.starts_with('/') && a.starts_with(w)))
            };
            (!zombie && words.iter().all(matches)).then_some(pid)
        })
        .collect();
    found
        .iter()
        .copied()
        .find(|pid| parent_of(*pid).is_none_or(|p| !found.contains(&p)))
}

/// The parent of `pid`, from `/proc/PID/stat` (its fourth field, after the command
/// name in parentheses, which may itself hold spaces or parentheses).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// Like [`find_pid`], panicking when there is none.
pub fn pid_of(words: &[&str]) -> i32 {
    find_pid(words).unwrap_or_else(|| panic!("no process with {words:?}"))
}

/// Host PIDs of the jail processes of a sandbox, or of one execution given as
/// `sandbox.execution` (from their cgroups).
pub fn jail_pids_of(sandbox: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for root in [
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup",
    ] {
        let Ok(parents) = std::fs::read_dir(root) else {
            continue;
        };
        for parent in parents.flatten() {
            let Ok(children) = std::fs::read_dir(parent.path()) else {
                continue;
            };
            for child in children.flatten() {
                let name = child.file_name().to_string_lossy().into_owned();
                if name == sandbox || name.starts_with(&format!("{sandbox}.")) {
                    if let Ok(procs) = std::fs::read_to_string(child.path().join("cgroup.procs")) {
                        out.extend(procs.lines().filter_map(|l| l.parse::<i32>().ok()));
                    }
                }
            }
        }
        if !out.is_empty() {
            break;
        }
    }
    out
}

/// A `kB` field of `/proc/PID/status` (`VmHWM:`, `VmRSS:`), in KiB.
pub fn status_kib(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} of {pid}"))
}

/// Resets the peak RSS of `pid` to its current RSS (`clear_refs` 5); bytes.
pub fn reset_peak(pid: i32) -> u64 {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    status_kib(pid, "VmHWM:") * 1024
}

/// Growth of the peak RSS of `pid` over `base` bytes.
pub fn peak_growth(pid: i32, base: u64) -> u64 {
    (status_kib(pid, "VmHWM:") * 1024).saturating_sub(base)
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};
    use std::time::Instant;

    use super::*;

    /// An argument no other process on the machine has.
    fn unique_arg() -> String {
        format!(
            "{}.{}",
            std::process::id(),
            crate::rng::rand_u128() % 1_000_000
        )
    }

    /// `sh -c script`, its stdout piped, killed when the test ends (also when it fails).
    fn sh(script: &str) -> Proc {
        Proc(
            Command::new("sh")
                .args(["-c", script])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    }

    #[test]
    fn a_child_that_honours_sigterm_is_stopped_by_it_within_its_grace() {
        let mut p = sh("echo up; exec sleep 30");
        assert_eq!(first_line(&mut p.0), "up");
        let start = Instant::now();
        stop(&mut p.0, Duration::from_secs(20));
        assert!(start.elapsed() < Duration::from_secs(10));
        let status = p.0.try_wait().unwrap().expect("reaped");
        assert_eq!(status.signal(), Some(15), "{status:?}");
    }

    #[test]
    fn a_child_that_ignores_sigterm_is_killed_once_its_grace_is_over() {
        let mut p = sh("trap '' TERM; echo trapped; while :; do sleep 1; done");
        assert_eq!(first_line(&mut p.0), "trapped");
        let start = Instant::now();
        stop(&mut p.0, Duration::from_millis(300));
        assert!(start.elapsed() >= Duration::from_millis(300));
        let status = p.0.try_wait().unwrap().expect("reaped");
        assert_eq!(status.signal(), Some(9), "{status:?}");
    }

    #[test]
    fn the_first_line_comes_without_its_end_and_the_rest_is_drained() {
        // 1 MB after the first line: the child blocks on a full pipe unless drained.
        let mut p = sh("echo first; head -c 1000000 /dev/zero");
        assert_eq!(first_line(&mut p.0), "first");
        let status = wait_exit(&mut p.0, Duration::from_secs(20)).expect("exited");
        assert!(status.success(), "{status:?}");
    }

    #[test]
    fn a_process_is_found_by_its_arguments_until_it_is_killed() {
        let arg = unique_arg();
        let mut p = Proc(Command::new("sleep").arg(&arg).spawn().unwrap());
        let pid = p.0.id() as i32;
        let found = wait_for(Duration::from_secs(5), Duration::from_millis(5), || {
            find_pid(&["sleep", &arg])
        });
        assert_eq!(found, Some(pid));
        assert_eq!(pid_of(&["sleep", &arg]), pid);
        assert_eq!(pids_naming(&arg), vec![pid]);
        assert_eq!(find_pid(&["sleep", &arg, "other"]), None);
        kill9(pid);
        // Killed, not reaped yet: no longer found.
        let gone = wait_for(Duration::from_secs(5), Duration::from_millis(5), || {
            find_pid(&["sleep", &arg]).is_none().then_some(())
        });
        assert_eq!(gone, Some(()));
        assert_eq!(p.0.wait().unwrap().signal(), Some(9));
    }

    #[test]
    fn a_dropped_proc_is_killed_and_reaped() {
        let p = Proc(Command::new("sleep").arg(unique_arg()).spawn().unwrap());
        let pid = p.0.id() as i32;
        drop(p);
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }
}
