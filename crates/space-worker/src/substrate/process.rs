//! Process identity: a PID alone can be reused, a PID with its start time (field
//! 22 of `/proc/PID/stat`, clock ticks since boot) names one process for good.

use std::fs;
use std::io;

use serde::{Deserialize, Serialize};

/// One process, for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProcessIdentity {
    /// Host PID.
    pub pid: i32,
    /// Start time in clock ticks since boot (`/proc/PID/stat` field 22).
    pub start_time: u64,
}

/// The fields of `/proc/PID/stat` this crate uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 3: `R`, `S`, `D`, `Z`, …
    pub state: char,
    /// Field 4.
    pub ppid: i32,
    /// Field 22.
    pub start_time: u64,
}

/// Parses `/proc/PID/stat` text. The command name (field 2) may contain spaces
/// and parentheses, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let after = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `fields[0]` is field 3.
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Reads `/proc/PID/stat`.
pub fn read_stat(pid: i32) -> io::Result<ProcStat> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&text).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed stat"))
}

impl ProcessIdentity {
    /// The identity of the process now holding `pid`.
    pub fn of(pid: i32) -> io::Result<Self> {
        Ok(Self {
            pid,
            start_time: read_stat(pid)?.start_time,
        })
    }

    /// Whether this very process still exists and has not exited (a zombie has
    /// exited: it only waits to be reaped).
    pub fn is_alive(&self) -> bool {
        matches!(read_stat(self.pid), Ok(s) if s.start_time == self.start_time && s.state != 'Z')
    }

    /// Whether this very process still has a `/proc` entry, zombie or not.
    pub fn exists(&self) -> bool {
        matches!(read_stat(self.pid), Ok(s) if s.start_time == self.start_time)
    }
}

/// Children of `pid` (its main thread's), from `/proc/PID/task/PID/children`.
pub fn children(pid: i32) -> io::Result<Vec<i32>> {
    let text = fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))?;
    Ok(text
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect())
}

/// Reaps those of `pids` whose parent is this process.
pub(crate) fn reap_children_of_this_process(pids: &[i32]) {
    let me = std::process::id() as i32;
    for &pid in pids {
        if matches!(read_stat(pid), Ok(s) if s.ppid == me) {
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_is_parsed_from_the_last_parenthesis() {
        let text = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        let stat = parse_stat(text).unwrap();
        assert_eq!(
            stat,
            ProcStat {
                state: 'S',
                ppid: 1,
                start_time: 987_654
            }
        );
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn own_identity_is_alive_and_a_changed_start_time_is_not() {
        let me = ProcessIdentity::of(std::process::id() as i32).unwrap();
        assert!(me.is_alive());
        let reused = ProcessIdentity {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(!reused.is_alive());
    }
}
