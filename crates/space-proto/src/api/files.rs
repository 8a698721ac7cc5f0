//! The JSON of file operations: a directory's entries, a path's description, and the
//! bodies of `mkdir` and `rename`.

use serde::{Deserialize, Serialize};

use crate::guest::{DirEntry, FileKind, FileStat};

/// One directory entry (`GET …/files/list`). A symlink is described, not followed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileEntry {
    /// Name within the directory.
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`, `420` for `0644`).
    #[serde(default)]
    pub mode: u32,
    /// Owner's uid in the sandbox.
    #[serde(default)]
    pub uid: u32,
    /// Group's gid in the sandbox.
    #[serde(default)]
    pub gid: u32,
    /// The owner's name in the sandbox's `/etc/passwd` (empty when it names none).
    #[serde(default)]
    pub owner: String,
    /// The group's name in the sandbox's `/etc/group` (empty when it names none).
    #[serde(default)]
    pub group: String,
    /// Modification time, RFC 3339 UTC with nanoseconds
    /// (`2026-11-30T01:02:03.000000042Z`).
    #[serde(default)]
    pub modified: String,
    /// A symlink's target, as the link holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
}

impl From<DirEntry> for FileEntry {
    fn from(e: DirEntry) -> Self {
        Self {
            name: e.name,
            kind: kind_name(e.kind).to_owned(),
            size: e.size,
            mode: e.mode,
            uid: e.uid,
            gid: e.gid,
            owner: e.owner,
            group: e.group,
            modified: super::rfc3339_nanos(e.modified_secs, e.modified_nanos),
            symlink_target: e.symlink_target,
        }
    }
}

/// A path's description (`GET …/files/stat`). A final symlink is described, not
/// followed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileInfo {
    /// Its last component (`/` for the root).
    pub name: String,
    /// The path described: as asked, joined to the agent's home when relative.
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`, `420` for `0644`).
    pub mode: u32,
    /// Owner's uid in the sandbox.
    pub uid: u32,
    /// Group's gid in the sandbox.
    pub gid: u32,
    /// The owner's name in the sandbox's `/etc/passwd` (empty when it names none).
    pub owner: String,
    /// The group's name in the sandbox's `/etc/group` (empty when it names none).
    pub group: String,
    /// Modification time, RFC 3339 UTC with nanoseconds.
    pub modified: String,
    /// A symlink's target, as the link holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
}

impl From<FileStat> for FileInfo {
    fn from(s: FileStat) -> Self {
        let name = std::path::Path::new(&s.path)
            .file_name()
            .map_or_else(|| s.path.clone(), |n| n.to_string_lossy().into_owned());
        Self {
            name,
            path: s.path,
            kind: kind_name(s.kind).to_owned(),
            size: s.size,
            mode: s.mode,
            uid: s.uid,
            gid: s.gid,
            owner: s.owner,
            group: s.group,
            modified: super::rfc3339_nanos(s.modified_secs, s.modified_nanos),
            symlink_target: s.symlink_target,
        }
    }
}

/// The name of a kind in JSON answers.
pub fn kind_name(kind: FileKind) -> &'static str {
    match kind {
        FileKind::File => "file",
        FileKind::Dir => "dir",
        FileKind::Symlink => "symlink",
        FileKind::Other => "other",
    }
}

/// Answer of `POST …/files/mkdir` (201 when made, 200 when a directory was there).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MkdirResponse {
    /// Whether this request made the directory.
    pub created: bool,
}

/// `POST …/files/rename`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RenameRequest {
    /// The path renamed: absolute, or relative to the agent's home.
    pub from: String,
    /// Its new path (a file there is replaced, as `rename(2)` does).
    pub to: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_is_named_by_its_last_component_and_the_root_by_itself() {
        let stat = |path: &str| FileStat {
            path: path.into(),
            kind: FileKind::Dir,
            size: 0,
            mode: 0o755,
            uid: 0,
            gid: 0,
            owner: "root".into(),
            group: "root".into(),
            modified_secs: 1,
            modified_nanos: 2,
            symlink_target: None,
        };
        assert_eq!(FileInfo::from(stat("/root/a.txt")).name, "a.txt");
        assert_eq!(FileInfo::from(stat("/")).name, "/");
        let info = FileInfo::from(stat("/root"));
        assert_eq!(info.modified, "1970-01-01T00:00:01.000000002Z");
        let json = serde_json::to_value(&info).unwrap();
        assert!(json.get("symlink_target").is_none(), "{json}");
    }

    #[test]
    fn an_entry_from_an_older_worker_without_the_new_fields_still_reads() {
        let e: FileEntry = serde_json::from_str(r#"{"name":"a","kind":"file","size":1}"#).unwrap();
        assert_eq!((e.mode, e.owner.as_str()), (0, ""));
    }
}
