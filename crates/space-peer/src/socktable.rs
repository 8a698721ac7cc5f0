//! The kernel's table of Unix sockets as evidence of who listens where.

use std::fs;
use std::path::Path;

use crate::PeerError;
use crate::fds::process_holds_socket;

/// `__SO_ACCEPTCON`: the socket is listening.
const ACCEPTCON: u32 = 1 << 16;

/// The inode of the listening Unix socket bound at `path`, from `/proc/net/unix` of this
/// process's network namespace.
pub fn listening_unix_inode(path: &Path) -> Result<u64, PeerError> {
    listening_in("/proc/net/unix", path)
}

/// [`listening_unix_inode`] from the table of process `pid`'s network namespace (a
/// VMM in a namespace of its own lists its sockets there, not in the worker's).
pub fn listening_unix_inode_of(pid: u32, path: &Path) -> Result<u64, PeerError> {
    listening_in(&format!("/proc/{pid}/net/unix"), path)
}

/// The most of a socket table read: a VMM in a network namespace of its own makes
/// as many sockets there as it likes, and the bridge reads that table at every
/// connect; a table past this is refused, not read without end.
pub const MAX_TABLE: u64 = 16 << 20;

fn read_table(path: &str) -> Result<String, PeerError> {
    use std::io::Read as _;
    let file = fs::File::open(path).map_err(|e| PeerError::sys("read the Unix socket table", e))?;
    let mut table = String::new();
    file.take(MAX_TABLE + 1)
        .read_to_string(&mut table)
        .map_err(|e| PeerError::sys("read the Unix socket table", e))?;
    if table.len() as u64 > MAX_TABLE {
        return Err(PeerError::SocketTable("the socket table is over its bound"));
    }
    Ok(table)
}

fn listening_in(table_path: &str, path: &Path) -> Result<u64, PeerError> {
    let table = read_table(table_path)?;
    let want = path
        .to_str()
        .ok_or(PeerError::SocketTable("path is not UTF-8"))?;
    let mut found = None;
    // Num RefCount Protocol Flags Type St Inode [Path]
    for line in table.lines().skip(1) {
        let cols: Vec<&str> = line.split_ascii_whitespace().collect();
        if cols.len() < 8 || cols[7] != want {
            continue;
        }
        let flags = u32::from_str_radix(cols[3], 16).unwrap_or(0);
        if flags & ACCEPTCON == 0 {
            continue;
        }
        let inode: u64 = cols[6]
            .parse()
            .map_err(|_| PeerError::SocketTable("bad inode"))?;
        if found.replace(inode).is_some() {
            return Err(PeerError::SocketTable("two listeners claim the path"));
        }
    }
    found.ok_or(PeerError::SocketTable("no listener at the path"))
}

/// Whether process `pid` holds a listening Unix socket bound at `path`, from the table
/// of its network namespace: bound as that absolute path, or — a VMM that bound a path
/// relative to its working directory (Firecracker's per-execution sockets, identical
/// in every execution so that a snapshot's names hold in its restore) — as the path's
/// file name while its working directory is the path's directory.
pub fn process_listens_at(pid: u32, path: &Path) -> Result<bool, PeerError> {
    let table = read_table(&format!("/proc/{pid}/net/unix"))?;
    let absolute = path
        .to_str()
        .ok_or(PeerError::SocketTable("path is not UTF-8"))?;
    let relative = path.file_name().and_then(|n| n.to_str());
    let cwd_is_dir = || -> bool {
        use std::os::unix::fs::MetadataExt;
        let (Some(dir), Ok(cwd)) = (path.parent(), fs::metadata(format!("/proc/{pid}/cwd"))) else {
            return false;
        };
        fs::metadata(dir).is_ok_and(|d| (d.dev(), d.ino()) == (cwd.dev(), cwd.ino()))
    };
    for line in table.lines().skip(1) {
        let cols: Vec<&str> = line.split_ascii_whitespace().collect();
        if cols.len() < 8 {
            continue;
        }
        let named = cols[7] == absolute || (Some(cols[7]) == relative && cwd_is_dir());
        let flags = u32::from_str_radix(cols[3], 16).unwrap_or(0);
        if !named || flags & ACCEPTCON == 0 {
            continue;
        }
        let Ok(inode) = cols[6].parse::<u64>() else {
            continue;
        };
        if process_holds_socket(pid, inode)? {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn listener_is_found_in_the_socket_table_and_held_by_this_process() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("s");
        let _l = UnixListener::bind(&path).unwrap();
        let inode = listening_unix_inode(&path).unwrap();
        assert!(process_holds_socket(std::process::id(), inode).unwrap());
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert!(!process_holds_socket(child.id(), inode).unwrap());
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_listener_in_another_network_namespace_is_in_its_processs_table_only() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("s");
        // A listener bound by a process in a network namespace of its own.
        let script = format!(
            "import socket, time; s = socket.socket(socket.AF_UNIX); s.bind('{}'); s.listen(); \
             print('up', flush=True); time.sleep(30)",
            path.display()
        );
        let mut child = match std::process::Command::new("unshare")
            .args(["--net", "python3", "-c", &script])
            .stdout(std::process::Stdio::piped())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                eprintln!("SKIPPED: needs unshare and python3: {e}");
                return;
            }
        };
        let mut up = String::new();
        let _ = std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut up,
        );
        if up.trim() != "up" {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!("SKIPPED: unshare --net needs root");
            return;
        }
        assert!(listening_unix_inode(&path).is_err());
        let inode = listening_unix_inode_of(child.id(), &path).unwrap();
        assert!(process_holds_socket(child.id(), inode).unwrap());
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn path_without_a_listener_is_not_in_the_table() {
        let t = tempfile::tempdir().unwrap();
        assert!(listening_unix_inode(&t.path().join("none")).is_err());
    }

    #[test]
    fn a_process_listens_at_a_path_only_with_its_own_listener_there() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("v.sock");
        let me = std::process::id();
        assert!(!process_listens_at(me, &path).unwrap());
        let _l = UnixListener::bind(&path).unwrap();
        assert!(process_listens_at(me, &path).unwrap());
        // Another process holds no listener there.
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert!(!process_listens_at(child.id(), &path).unwrap());
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_relative_bind_counts_only_in_the_listeners_working_directory() {
        // A VMM's way: `v.sock` bound relative to its working directory.
        let t = tempfile::tempdir().unwrap();
        let (dir, other) = (t.path().join("fc-1"), t.path().join("fc-2"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        let Ok(mut child) = std::process::Command::new("python3")
            .args([
                "-c",
                "import socket,time\ns=socket.socket(socket.AF_UNIX)\ns.bind('v.sock')\ns.listen()\ntime.sleep(10)",
            ])
            .current_dir(&dir)
            .spawn()
        else {
            eprintln!("SKIPPED: needs python3 to bind a relative socket path");
            return;
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !dir.join("v.sock").exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(process_listens_at(child.id(), &dir.join("v.sock")).unwrap());
        // The same name in another directory is not where it listens.
        assert!(!process_listens_at(child.id(), &other.join("v.sock")).unwrap());
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
