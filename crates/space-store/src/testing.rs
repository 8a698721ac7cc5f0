//! A throwaway PostgreSQL server for tests (feature `pg-harness`).
//!
//! [`PgServer::start`] runs `initdb` into a fresh temporary directory and `pg_ctl
//! start` on a free loopback port, with the Unix socket in the same directory, so
//! tests running in parallel never share a server. Dropping the value stops the server
//! and removes the directory; that also happens when a test panics, since the value
//! is dropped while unwinding.
//!
//! PostgreSQL refuses to run as root. When the test runs as root, every server command
//! runs as the `postgres` user (through `runuser`, or `su` where `runuser` is missing)
//! and the directory is handed to that user first.
//!
//! ```no_run
//! # async fn demo() {
//! use space_store::{Store, testing::PgServer};
//! let Some(pg) = PgServer::start().expect("PostgreSQL failed to start") else {
//!     return; // binaries missing: start() said so on stderr
//! };
//! let store = Store::open(&pg.url()).await.unwrap();
//! # drop(store);
//! # }
//! ```

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// What to do when binaries are missing.
pub const INSTALL_HINT: &str = "install the Debian postgresql package \
     (`apt-get update && apt-get install -y postgresql`)";

/// When set (to anything), missing binaries fail the test instead of skipping it: for
/// CI, where a silent skip would hide a missing install step.
pub const REQUIRE_ENV: &str = "SPACE_REQUIRE_POSTGRES";

/// Overrides where `initdb` and `pg_ctl` are looked for.
pub const BIN_DIR_ENV: &str = "SPACE_PG_BIN_DIR";

/// How often `start` retries when the chosen port was taken in the meantime.
const START_ATTEMPTS: usize = 3;

/// A running throwaway server; stopped and deleted on drop.
pub struct PgServer {
    dir: tempfile::TempDir,
    bin_dir: PathBuf,
    port: u16,
    run_as: Option<RunAs>,
}

/// The unprivileged user that server commands run as when the test runs as root.
#[derive(Debug, Clone)]
struct RunAs {
    uid: u32,
    gid: u32,
    runuser: bool,
}

impl fmt::Debug for PgServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgServer")
            .field("dir", &self.dir.path())
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl PgServer {
    /// Starts a server, blocking for about a second. `Ok(None)` (after printing what is
    /// missing to stderr) when no PostgreSQL binaries are installed, unless
    /// [`REQUIRE_ENV`] is set; `Err` when they are installed but the server does not
    /// come up.
    pub fn start() -> io::Result<Option<Self>> {
        let bin_dir = match find_bin_dir() {
            Ok(dir) => dir,
            Err(missing) => {
                let msg = format!("PostgreSQL tests need {missing}: {INSTALL_HINT}");
                if std::env::var_os(REQUIRE_ENV).is_some() {
                    return Err(io::Error::new(io::ErrorKind::NotFound, msg));
                }
                eprintln!("skipping: {msg}");
                return Ok(None);
            }
        };
        let run_as = if rustix::process::geteuid().is_root() {
            Some(postgres_user()?)
        } else {
            None
        };
        let dir = tempfile::Builder::new().prefix("space-pg-").tempdir()?;
        if let Some(user) = &run_as {
            std::os::unix::fs::chown(dir.path(), Some(user.uid), Some(user.gid))?;
        }
        let mut server = Self {
            dir,
            bin_dir,
            port: 0,
            run_as,
        };
        server.initdb()?;
        let mut last_err = None;
        for _ in 0..START_ATTEMPTS {
            server.port = free_port()?;
            match server.pg_ctl_start() {
                Ok(()) => return Ok(Some(server)),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("PostgreSQL did not start")))
    }

    /// A URL for [`crate::Store::open`]: superuser `postgres`, database `postgres`, no
    /// password (the server trusts local connections).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory holding the Unix socket (and the data directory and log).
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn initdb(&self) -> io::Result<()> {
        let data = self.data_dir();
        let args: Vec<OsString> = vec![
            "-D".into(),
            data.into(),
            "-U".into(),
            "postgres".into(),
            "--auth=trust".into(),
            "--no-sync".into(),
            "--encoding=UTF8".into(),
            "--locale=C".into(),
        ];
        self.run("initdb", &args)
    }

    fn pg_ctl_start(&self) -> io::Result<()> {
        // -F: no fsync, the data is thrown away anyway. The socket goes in our own
        // directory so parallel servers and a system server never collide.
        let options = format!(
            "-F -h 127.0.0.1 -p {} -k {}",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log");
        let args: Vec<OsString> = vec![
            "start".into(),
            "-w".into(),
            "-t".into(),
            "60".into(),
            "-D".into(),
            self.data_dir().into(),
            "-l".into(),
            log.clone().into(),
            "-o".into(),
            options.into(),
        ];
        self.run("pg_ctl", &args).map_err(|e| {
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            io::Error::new(e.kind(), format!("{e}\nserver log:\n{tail}"))
        })
    }

    fn stop(&self) -> io::Result<()> {
        let args: Vec<OsString> = vec![
            "stop".into(),
            "-w".into(),
            "-m".into(),
            "immediate".into(),
            "-D".into(),
            self.data_dir().into(),
        ];
        self.run("pg_ctl", &args)
    }

    /// Runs one of the server binaries, as `postgres` when we are root.
    fn run(&self, program: &str, args: &[OsString]) -> io::Result<()> {
        let exe = self.bin_dir.join(program);
        let mut cmd = match &self.run_as {
            None => Command::new(&exe),
            Some(RunAs { runuser: true, .. }) => {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(&exe);
                c
            }
            Some(RunAs { runuser: false, .. }) => {
                let mut line = shell_quote(exe.as_os_str());
                for a in args {
                    line.push(' ');
                    line.push_str(&shell_quote(a));
                }
                let mut c = Command::new("su");
                c.args(["postgres", "-s", "/bin/sh", "-c"]).arg(line);
                c
            }
        };
        if !matches!(self.run_as, Some(RunAs { runuser: false, .. })) {
            cmd.args(args);
        }
        // The server user may not be able to enter the test's working directory.
        cmd.current_dir(self.dir.path());
        check(program, cmd.output()?)
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if self.port != 0 {
            if let Err(e) = self.stop() {
                eprintln!("stopping the test PostgreSQL server failed: {e}");
            }
        }
        // The TempDir field then removes the directory; root may delete the files the
        // postgres user created.
    }
}

/// Where `initdb` and `pg_ctl` live ([`BIN_DIR_ENV`] first), or a description of what
/// is missing.
pub fn find_bin_dir() -> Result<PathBuf, String> {
    locate(std::env::var_os(BIN_DIR_ENV).map(PathBuf::from))
}

fn locate(bin_override: Option<PathBuf>) -> Result<PathBuf, String> {
    let has_both = |d: &Path| d.join("initdb").is_file() && d.join("pg_ctl").is_file();
    if let Some(dir) = bin_override {
        return if has_both(&dir) {
            Ok(dir)
        } else {
            Err(format!(
                "initdb and pg_ctl in {} ({BIN_DIR_ENV})",
                dir.display()
            ))
        };
    }
    // Debian keeps the server binaries out of PATH, one directory per major version;
    // take the newest.
    let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            Some((version, e.path().join("bin")))
        })
        .filter(|(_, bin)| has_both(bin))
        .collect();
    debian.sort();
    if let Some((_, bin)) = debian.pop() {
        return Ok(bin);
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .find(|d| has_both(d))
        .ok_or_else(|| {
            "the initdb and pg_ctl binaries (none in /usr/lib/postgresql/*/bin or PATH)".into()
        })
}

fn postgres_user() -> io::Result<RunAs> {
    let missing = || {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("running as root needs a `postgres` user to run the server: {INSTALL_HINT}"),
        )
    };
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    let entry = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.first() == Some(&"postgres") && f.len() >= 4)
        .ok_or_else(missing)?;
    let uid = entry[2].parse().map_err(|_| missing())?;
    let gid = entry[3].parse().map_err(|_| missing())?;
    let runuser = ["/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser"]
        .iter()
        .any(|p| Path::new(p).exists());
    Ok(RunAs { uid, gid, runuser })
}

/// A port that was free a moment ago; `start` retries if another process takes it.
fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn check(program: &str, out: Output) -> io::Result<()> {
    if out.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "{program} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )))
}

fn shell_quote(s: &std::ffi::OsStr) -> String {
    format!("'{}'", s.to_string_lossy().replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bin_dir_override_without_the_binaries_names_what_is_missing() {
        let empty = tempfile::tempdir().unwrap();
        let err = locate(Some(empty.path().to_owned())).unwrap_err();
        assert!(err.contains("initdb and pg_ctl"), "{err}");
        assert!(err.contains(&empty.path().display().to_string()), "{err}");
    }

    #[test]
    fn shell_quoting_survives_single_quotes() {
        assert_eq!(shell_quote("a'b c".as_ref()), r"'a'\''b c'");
    }
}
