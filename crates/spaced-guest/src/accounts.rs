//! The accounts of the sandbox: a name or a uid resolved through the sandbox's own
//! `/etc/passwd` and `/etc/group`, read by the agent itself (no NSS, no libc
//! `getpwnam`: the files are the sandbox's, so possibly hostile). Each file is read
//! up to [`MAX_ACCOUNTS_FILE`] bytes and parsed line by line; a line that does not
//! parse is skipped, as libc's files backend does.

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;

use space_proto::guest::{Account, ErrorKind, WireError};

/// Most bytes read of `/etc/passwd` or `/etc/group`.
pub const MAX_ACCOUNTS_FILE: u64 = 1 << 20;

/// Longest account or group name taken, in bytes.
const MAX_NAME: usize = 256;

/// Most supplementary groups given to a process (the kernel's `NGROUPS_MAX`).
const MAX_GROUPS: usize = 65_536;

/// Who a process runs as, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    /// The account's name (the uid as text when passwd has none).
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the primary group included).
    pub groups: Vec<u32>,
    pub home: PathBuf,
    pub shell: Option<String>,
}

/// One line of `/etc/passwd`.
#[derive(Debug, PartialEq, Eq)]
struct PasswdEntry<'a> {
    name: &'a str,
    uid: u32,
    gid: u32,
    home: &'a str,
    shell: &'a str,
}

fn passwd_line(line: &str) -> Option<PasswdEntry<'_>> {
    let f: Vec<&str> = line.split(':').collect();
    if f.len() < 7 || f[0].is_empty() || f[0].starts_with('#') {
        return None;
    }
    Some(PasswdEntry {
        name: f[0],
        uid: f[2].parse().ok()?,
        gid: f[3].parse().ok()?,
        home: f[5],
        shell: f[6],
    })
}

/// The groups of `name` (primary group `gid`) in the text of `/etc/group`.
fn groups_of(group: &str, name: &str, gid: u32) -> Vec<u32> {
    let mut out = vec![gid];
    for line in group.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 4 || f[0].starts_with('#') {
            continue;
        }
        let Ok(g) = f[2].parse::<u32>() else { continue };
        if f[3].split(',').any(|m| m.trim() == name) && !out.contains(&g) {
            out.push(g);
            if out.len() == MAX_GROUPS {
                break;
            }
        }
    }
    out
}

/// Resolves `account` against the texts of `/etc/passwd` and `/etc/group`.
pub(crate) fn resolve_in(
    account: &Account,
    passwd: &str,
    group: &str,
) -> Result<Identity, WireError> {
    let found = passwd
        .lines()
        .filter_map(passwd_line)
        .find(|e| match account {
            Account::Name(n) => e.name == n,
            Account::Uid(u) => e.uid == *u,
        });
    match (found, account) {
        (Some(e), _) => {
            let home = if e.home.starts_with('/') { e.home } else { "/" };
            Ok(Identity {
                name: e.name.to_owned(),
                uid: e.uid,
                gid: e.gid,
                groups: groups_of(group, e.name, e.gid),
                home: PathBuf::from(home),
                shell: (!e.shell.is_empty()).then(|| e.shell.to_owned()),
            })
        }
        // A bare uid the sandbox does not name: its own group, `/` as home.
        (None, Account::Uid(u)) => Ok(Identity {
            name: u.to_string(),
            uid: *u,
            gid: *u,
            groups: vec![*u],
            home: PathBuf::from("/"),
            shell: None,
        }),
        (None, Account::Name(n)) => Err(WireError::new(
            ErrorKind::UnknownUser,
            format!("no user {n:?} in the sandbox's /etc/passwd"),
        )),
    }
}

/// Reads up to [`MAX_ACCOUNTS_FILE`] bytes of `path` as text (lossy); a missing file
/// is empty.
fn read_bounded(path: &str) -> String {
    let mut bytes = Vec::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(MAX_ACCOUNTS_FILE).read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Resolves `account` through the sandbox's `/etc/passwd` and `/etc/group`.
pub(crate) fn resolve(account: &Account) -> Result<Identity, WireError> {
    if let Account::Name(n) = account {
        if n.is_empty() || n.len() > MAX_NAME || n.contains([':', '\n', '\0']) {
            return Err(WireError::new(
                ErrorKind::InvalidArgument,
                format!("invalid user name {n:?}"),
            ));
        }
    }
    resolve_in(
        account,
        &read_bounded("/etc/passwd"),
        &read_bounded("/etc/group"),
    )
}

/// Resolves `account` for a process or a file operation, and checks that the agent
/// can take its ids: a sandbox whose user namespace maps only root (a rootless
/// worker's) or an agent without `CAP_SETUID` is refused clearly, before anything
/// starts.
pub(crate) fn take(account: Option<&Account>) -> Result<Option<Identity>, WireError> {
    let Some(account) = account else {
        return Ok(None);
    };
    let id = resolve(account)?;
    if !crate::sys::can_act_as(id.uid, id.gid) {
        return Err(WireError::new(
            ErrorKind::PermissionDenied,
            format!(
                "cannot act as {account} (uid {}, gid {}): the sandbox's user namespace \
                 does not map it (a rootless worker's sandboxes have only root), or the \
                 agent may not switch accounts",
                id.uid, id.gid
            ),
        ));
    }
    Ok(Some(id))
}

/// The names the sandbox gives to uids and gids (its `/etc/passwd` and `/etc/group`),
/// to describe who owns a file. The first line naming an id wins, as in libc; a name
/// longer than [`MAX_NAME`] bytes names nothing (the files are the sandbox's, and a
/// name goes into every entry of a listing).
#[derive(Debug, Default)]
pub(crate) struct Names {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl Names {
    /// The names of the sandbox's own files, read bounded.
    pub(crate) fn load() -> Self {
        Self::parse(&read_bounded("/etc/passwd"), &read_bounded("/etc/group"))
    }

    /// The names in the texts of `/etc/passwd` and `/etc/group`.
    pub(crate) fn parse(passwd: &str, group: &str) -> Self {
        let mut names = Self::default();
        for e in passwd.lines().filter_map(passwd_line) {
            if e.name.len() <= MAX_NAME {
                names
                    .users
                    .entry(e.uid)
                    .or_insert_with(|| e.name.to_owned());
            }
        }
        for line in group.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() < 3 || f[0].is_empty() || f[0].starts_with('#') || f[0].len() > MAX_NAME {
                continue;
            }
            let Ok(gid) = f[2].parse::<u32>() else {
                continue;
            };
            names.groups.entry(gid).or_insert_with(|| f[0].to_owned());
        }
        names
    }

    /// The name of `uid`, empty when the sandbox names none.
    pub(crate) fn user(&self, uid: u32) -> String {
        self.users.get(&uid).cloned().unwrap_or_default()
    }

    /// The name of `gid`, empty when the sandbox names none.
    pub(crate) fn group(&self, gid: u32) -> String {
        self.groups.get(&gid).cloned().unwrap_or_default()
    }
}

impl Identity {
    /// Acts as this account on files in the calling thread until the guard drops.
    pub(crate) fn act(&self) -> Result<crate::sys::ActingAs, WireError> {
        crate::sys::ActingAs::new(self.uid, self.gid, &self.groups).map_err(|e| {
            WireError::new(
                ErrorKind::PermissionDenied,
                format!("cannot act as {}: {e}", self.name),
            )
        })
    }

    /// The working directory of a process that names none: the home, or `/` when
    /// the home is missing.
    pub(crate) fn default_cwd(&self) -> PathBuf {
        if self.home.is_dir() {
            self.home.clone()
        } else {
            PathBuf::from("/")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
        # a comment\n\
        broken line\n\
        bad:x:notanumber:0::/:/bin/sh\n\
        user:x:1000:1000:User,,,:/home/user:/bin/sh\n\
        svc:x:998:997::relative:\n";
    const GROUP: &str =
        "root:x:0:\nusers:x:100:user,other\nwheel:x:10: user \ngarbage\nuser:x:1000:\n";

    #[test]
    fn a_name_resolves_to_its_uid_groups_home_and_shell() {
        let id = resolve_in(&Account::Name("user".into()), PASSWD, GROUP).unwrap();
        assert_eq!((id.uid, id.gid), (1000, 1000));
        assert_eq!(id.groups, [1000, 100, 10]);
        assert_eq!(id.home, PathBuf::from("/home/user"));
        assert_eq!(id.shell.as_deref(), Some("/bin/sh"));
    }

    #[test]
    fn a_uid_in_passwd_takes_its_entry_and_one_that_is_not_runs_with_its_own_group_and_root_home() {
        let id = resolve_in(&Account::Uid(1000), PASSWD, GROUP).unwrap();
        assert_eq!(id.name, "user");
        let id = resolve_in(&Account::Uid(4242), PASSWD, GROUP).unwrap();
        assert_eq!(
            (id.uid, id.gid, id.groups.as_slice()),
            (4242, 4242, &[4242][..])
        );
        assert_eq!(id.home, PathBuf::from("/"));
    }

    #[test]
    fn owners_and_groups_are_named_by_the_first_line_naming_them_and_unnamed_ids_are_empty() {
        let names = Names::parse(
            &format!("{PASSWD}dup:x:1000:1000::/:/bin/sh\n"),
            &format!(
                "{GROUP}other:x:100:\n:x:5:\n{}:x:6:\n",
                "g".repeat(MAX_NAME + 1)
            ),
        );
        assert_eq!(names.user(0), "root");
        assert_eq!(names.user(1000), "user");
        assert_eq!(names.user(4242), "");
        assert_eq!(names.group(100), "users");
        assert_eq!(names.group(10), "wheel");
        assert_eq!(names.group(5), "");
        assert_eq!(names.group(6), "");
    }

    #[test]
    fn an_unknown_name_is_unknown_user_and_malformed_lines_are_skipped() {
        let e = resolve_in(&Account::Name("nobody-here".into()), PASSWD, GROUP).unwrap_err();
        assert_eq!(e.kind, ErrorKind::UnknownUser);
        let e = resolve_in(&Account::Name("bad".into()), PASSWD, GROUP).unwrap_err();
        assert_eq!(e.kind, ErrorKind::UnknownUser);
        // A relative home is no home: `/`.
        let id = resolve_in(&Account::Name("svc".into()), PASSWD, GROUP).unwrap();
        assert_eq!(id.home, PathBuf::from("/"));
        assert_eq!(id.shell, None);
    }
}
