//! What a failed test prints about its `space up`: the edge listener's accept queue
//! (a full one is why a connect to loopback times out), the state and kernel wait of
//! each of the process's threads (a stalled runtime shows as every worker thread
//! asleep in the same place), and the end of its log.

use std::fmt::Write as _;
use std::path::Path;

/// The log lines printed at most.
const LOG_LINES: usize = 80;

/// The connections waiting to be accepted by the loopback listener on `port`, from
/// `/proc/net/tcp` (a listening socket's `rx_queue`; tokio's listeners have a
/// backlog of 1024), `None` when no listener is found.
pub fn accept_queue(port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    listener_queue(&table, port)
}

fn listener_queue(table: &str, port: u16) -> Option<u64> {
    let want = format!(":{port:04X}");
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // sl local rem st tx:rx …; state 0A is LISTEN.
        if f.len() < 5 || !f[1].ends_with(&want) || f[3] != "0A" {
            return None;
        }
        let (_, rx) = f[4].split_once(':')?;
        u64::from_str_radix(rx, 16).ok()
    })
}

/// One line per thread of `pid`: its name, state and kernel wait channel.
pub fn threads(pid: u32) -> String {
    let mut out = String::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("(process {pid} is gone)\n");
    };
    for t in tasks.flatten() {
        let dir = t.path();
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        let stat = read("stat");
        // The state follows the parenthesised name, which may hold spaces.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or("?");
        let _ = writeln!(
            out,
            "  {} {:<16} {state} {}",
            t.file_name().to_string_lossy(),
            read("comm").trim(),
            read("wchan").trim(),
        );
    }
    out
}

/// The last [`LOG_LINES`] lines of the log at `path`.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(LOG_LINES);
    let mut out = String::new();
    if from > 0 {
        let _ = writeln!(out, "  … {from} earlier lines in {}", path.display());
    }
    for l in &lines[from..] {
        let _ = writeln!(out, "  {l}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listener_on_the_port_is_found_and_its_queue_read() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:98B7 00000000:0000 0A 00000000:00000401 00:00000000 00000000     0        0 1\n\
   1: 0100007F:98B7 0100007F:C000 01 00000000:00000000 00:00000000 00000000     0        0 2\n\
   2: 0100007F:1F90 00000000:0000 0A 00000080:00000000 00:00000000 00000000     0        0 3\n";
        assert_eq!(listener_queue(table, 0x98B7), Some(1025));
        assert_eq!(listener_queue(table, 8080), Some(0));
        assert_eq!(listener_queue(table, 1), None);
    }

    #[test]
    fn a_real_listener_shows_its_unaccepted_connection() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let _c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        assert_eq!(accept_queue(port), Some(1));
        assert!(threads(std::process::id()).lines().count() >= 1);
    }
}
