//! File operations. Paths are taken as given (absolute, or relative to the agent's
//! home): containment is the sandbox's job, by its root filesystem, not the agent's.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use space_proto::guest::{
    Account, AgentBody, ByteRange, DirEntry, ErrorKind, FileKind, FileStat, Input, MAX_CHUNK,
    Operation, RequestId, WireError,
};

use crate::accounts::{self, Names};
use crate::agent::Agent;
use crate::conn::{Conn, Flow, io_error};
use crate::sys::ActingAs;

/// Entries per `Entries` frame, at most.
const LIST_BATCH: usize = 256;

/// Bytes of names, owners and link targets per `Entries` frame, at most about: an
/// entry holds at most some 14 KiB of them (a name of 255 bytes and a target of 4096,
/// each up to three times as long once made UTF-8, two account names of at most 256),
/// so a batch stays far under the frame cap whatever the directory holds.
const LIST_BATCH_BYTES: usize = 256 << 10;

/// Resolves a client path against the agent's home.
pub(crate) fn resolve(agent: &Agent, path: &str) -> Result<PathBuf, WireError> {
    if path.is_empty() {
        return Err(WireError::new(ErrorKind::InvalidArgument, "empty path"));
    }
    if path.contains('\0') {
        return Err(WireError::new(
            ErrorKind::InvalidArgument,
            "path contains NUL",
        ));
    }
    Ok(agent.home.join(path))
}

fn kind_of(ft: fs::FileType) -> FileKind {
    if ft.is_symlink() {
        FileKind::Symlink
    } else if ft.is_dir() {
        FileKind::Dir
    } else if ft.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

/// Operations with one answer: stat, mkdir, remove, rename.
pub(crate) fn simple(agent: &Agent, op: Operation) -> Result<AgentBody, WireError> {
    match op {
        Operation::Stat { path } => {
            stat(&resolve(agent, &path)?).map(|s| AgentBody::Stat(Box::new(s)))
        }
        Operation::Mkdir {
            path,
            parents,
            user,
        } => {
            let p = resolve(agent, &path)?;
            let _acting = as_account(user.as_ref())?;
            let created = mkdir(&p, parents).map_err(|e| io_error(&format!("mkdir {path}"), &e))?;
            Ok(AgentBody::Made { created })
        }
        Operation::Remove { path, recursive } => {
            let p = resolve(agent, &path)?;
            remove(&p, recursive).map_err(|e| io_error(&format!("remove {path}"), &e))?;
            Ok(AgentBody::Done)
        }
        Operation::Rename { from, to, user } => {
            let (f, t) = (resolve(agent, &from)?, resolve(agent, &to)?);
            let _acting = as_account(user.as_ref())?;
            fs::rename(&f, &t).map_err(|e| io_error(&format!("rename {from} to {to}"), &e))?;
            Ok(AgentBody::Done)
        }
        other => Err(WireError::new(
            ErrorKind::InvalidArgument,
            format!("not a single-answer operation: {other:?}"),
        )),
    }
}

/// Makes the directory `p`, mode 0755 whatever the agent's umask (and its missing
/// parents with `parents`): whether this call made it. A directory already there
/// (through a symlink too) is `Ok(false)` with `parents`; without, and for anything
/// else already there, `EEXIST`.
fn mkdir(p: &Path, parents: bool) -> io::Result<bool> {
    if parents {
        if let Some(dir) = p.parent() {
            make_dirs(dir)?;
        }
    }
    match fs::DirBuilder::new().mode(0o755).create(p) {
        Ok(()) => {
            fs::set_permissions(p, fs::Permissions::from_mode(0o755))?;
            Ok(true)
        }
        Err(e)
            if e.kind() == io::ErrorKind::AlreadyExists
                && parents
                && fs::metadata(p).is_ok_and(|m| m.is_dir()) =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

fn stat(p: &Path) -> Result<FileStat, WireError> {
    let shown = p.display().to_string();
    let md = fs::symlink_metadata(p).map_err(|e| io_error(&format!("stat {shown}"), &e))?;
    let kind = kind_of(md.file_type());
    let names = Names::load();
    Ok(FileStat {
        path: p.to_string_lossy().into_owned(),
        kind,
        size: md.len(),
        mode: md.mode() & 0o7777,
        uid: md.uid(),
        gid: md.gid(),
        owner: names.user(md.uid()),
        group: names.group(md.gid()),
        modified_secs: md.mtime(),
        modified_nanos: u32::try_from(md.mtime_nsec()).unwrap_or(0),
        symlink_target: link_target(p, kind),
    })
}

/// What the symlink at `p` holds (`None` for anything else, or a link that cannot be
/// read any more).
fn link_target(p: &Path, kind: FileKind) -> Option<String> {
    if kind != FileKind::Symlink {
        return None;
    }
    fs::read_link(p)
        .ok()
        .map(|t| t.to_string_lossy().into_owned())
}

fn remove(p: &Path, recursive: bool) -> io::Result<()> {
    let md = fs::symlink_metadata(p)?;
    if md.is_dir() {
        if recursive {
            remove_tree(p)
        } else {
            fs::remove_dir(p)
        }
    } else {
        fs::remove_file(p)
    }
}

/// Subdirectories queued per visit of a directory in [`remove_tree`].
const REMOVE_BATCH: usize = 256;

/// Removes a directory tree without recursion: std's `remove_dir_all` recurses once
/// per level, and a workload can build a tree deep enough to overflow a connection
/// thread's stack, which would abort the whole agent. Memory stays at most
/// `REMOVE_BATCH` paths per level: a directory with more subdirectories is visited
/// again after the first batch is gone. Symlinks are removed, never followed.
fn remove_tree(root: &Path) -> io::Result<()> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.last().cloned() {
        let mut subdirs = Vec::new();
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                if subdirs.len() < REMOVE_BATCH {
                    subdirs.push(entry.path());
                }
            } else {
                fs::remove_file(entry.path())?;
            }
        }
        if subdirs.is_empty() {
            fs::remove_dir(&dir)?;
            stack.pop();
        } else {
            stack.extend(subdirs);
        }
    }
    Ok(())
}

/// Lists a directory in batches; an entry removed while listing is skipped.
pub(crate) fn list(conn: &mut Conn<'_>, id: RequestId, path: &str) -> Flow {
    let dir = match resolve(conn.agent, path)
        .and_then(|p| fs::read_dir(&p).map_err(|e| io_error(&format!("list {path}"), &e)))
    {
        Ok(d) => d,
        Err(e) => return conn.send_error(id, e),
    };
    let names = Names::load();
    let mut batch = Vec::with_capacity(LIST_BATCH);
    let mut batch_bytes = 0;
    for entry in dir {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => return conn.send_error(id, io_error(&format!("list {path}"), &e)),
        };
        // Not followed: a symlink is described as itself.
        let Ok(md) = entry.metadata() else { continue };
        let kind = kind_of(md.file_type());
        batch.push(DirEntry {
            name: entry.file_name().to_string_lossy().into_owned(),
            kind,
            size: md.len(),
            mode: md.mode() & 0o7777,
            uid: md.uid(),
            gid: md.gid(),
            owner: names.user(md.uid()),
            group: names.group(md.gid()),
            modified_secs: md.mtime(),
            modified_nanos: u32::try_from(md.mtime_nsec()).unwrap_or(0),
            symlink_target: link_target(&entry.path(), kind),
        });
        if let Some(e) = batch.last() {
            batch_bytes += e.name.len()
                + e.owner.len()
                + e.group.len()
                + e.symlink_target.as_ref().map_or(0, String::len);
        }
        if batch.len() == LIST_BATCH || batch_bytes >= LIST_BATCH_BYTES {
            conn.queue(id, AgentBody::Entries(std::mem::take(&mut batch)))?;
            batch_bytes = 0;
        }
    }
    if !batch.is_empty() {
        conn.queue(id, AgentBody::Entries(batch))?;
    }
    conn.send(id, AgentBody::Done)
}

/// Streams up to `max_bytes` of a file from `offset`. Each chunk is written to the
/// socket before the next is read, so memory stays at one chunk whatever the size.
pub(crate) fn read(
    conn: &mut Conn<'_>,
    id: RequestId,
    path: &str,
    offset: u64,
    max_bytes: u64,
) -> Flow {
    let mut file = match open_for_read(conn.agent, path, offset) {
        Ok(f) => f,
        Err(e) => return conn.send_error(id, e),
    };
    let mut buf = vec![0u8; MAX_CHUNK];
    let mut sent = 0u64;
    while sent < max_bytes {
        let want = (max_bytes - sent).min(MAX_CHUNK as u64) as usize;
        let n = match file.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return conn.send_error(id, io_error(&format!("read {path}"), &e)),
        };
        conn.queue(id, AgentBody::FileData(buf[..n].to_vec()))?;
        sent += n as u64;
    }
    // One more byte tells whether the cap cut the file short.
    let truncated = sent == max_bytes && matches!(file.read(&mut buf[..1]), Ok(1));
    conn.send(
        id,
        AgentBody::ReadEnd {
            bytes: sent,
            truncated,
        },
    )
}

/// Streams the bytes `range` selects of a file of any size: first `FileOpened` with
/// the size of the open file (its descriptor's, so a rename over the path meanwhile
/// changes nothing) and the span, then the span in chunks (each written before the
/// next is read: memory stays at one chunk), then `ReadEnd`. When the span reaches the
/// end seen at open, one more byte is tried: `truncated` then says the file grew while
/// it was read; a file that shrank ends with fewer bytes than the span.
pub(crate) fn read_range(conn: &mut Conn<'_>, id: RequestId, path: &str, range: ByteRange) -> Flow {
    let opened = open_for_read(conn.agent, path, 0).and_then(|f| {
        let size = f
            .metadata()
            .map_err(|e| io_error(&format!("read {path}"), &e))?
            .len();
        Ok((f, size))
    });
    let (mut file, size) = match opened {
        Ok(v) => v,
        Err(e) => return conn.send_error(id, e),
    };
    let span = range.resolve(size);
    conn.queue(id, AgentBody::FileOpened { size, range: span })?;
    let Some((start, len)) = span else {
        return conn.send(
            id,
            AgentBody::ReadEnd {
                bytes: 0,
                truncated: false,
            },
        );
    };
    if start > 0 {
        if let Err(e) = file.seek(SeekFrom::Start(start)) {
            return conn.send_error(id, io_error(&format!("read {path}"), &e));
        }
    }
    let mut buf = vec![0u8; MAX_CHUNK];
    let mut sent = 0u64;
    while sent < len {
        let want = (len - sent).min(MAX_CHUNK as u64) as usize;
        let n = match file.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return conn.send_error(id, io_error(&format!("read {path}"), &e)),
        };
        conn.queue(id, AgentBody::FileData(buf[..n].to_vec()))?;
        sent += n as u64;
    }
    let grew = sent == len && start + len == size && matches!(file.read(&mut buf[..1]), Ok(1));
    conn.send(
        id,
        AgentBody::ReadEnd {
            bytes: sent,
            truncated: grew,
        },
    )
}

fn open_for_read(agent: &Agent, path: &str, offset: u64) -> Result<File, WireError> {
    let p = resolve(agent, path)?;
    let err = |e: io::Error| io_error(&format!("read {path}"), &e);
    // O_NONBLOCK so that opening a FIFO cannot hang the connection.
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&p)
        .map_err(err)?;
    let ft = file.metadata().map_err(err)?.file_type();
    if ft.is_dir() {
        return Err(WireError::new(
            ErrorKind::IsADirectory,
            format!("read {path}: is a directory"),
        ));
    }
    if ft.is_fifo() || ft.is_socket() {
        return Err(WireError::new(
            ErrorKind::InvalidArgument,
            format!("read {path}: not a regular file"),
        ));
    }
    if offset > 0 {
        file.seek(SeekFrom::Start(offset)).map_err(err)?;
    }
    Ok(file)
}

/// Distinguishes temporary files of concurrent writes in one agent.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A temporary file that removes itself unless it was renamed into place.
struct TempFile {
    path: PathBuf,
    target: PathBuf,
    file: File,
    done: bool,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Replaces a file atomically: the data goes to a temporary file in the same directory,
/// which is fsynced and renamed over the target, and the directory is fsynced. A reader
/// sees the old content or the new, never a mix, and a crash leaves one of the two.
///
/// The client sends all its data before reading the answer, so on failure the rest of
/// the data is read and dropped, and the error is the one final answer.
pub(crate) fn write(
    conn: &mut Conn<'_>,
    id: RequestId,
    path: &str,
    mode: Option<u32>,
    parents: bool,
    user: Option<&Account>,
) -> Flow {
    // Declared first, dropped last: the temporary file goes as the account that made it.
    let acting = as_account(user);
    let mut state = acting
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|_| begin_write(conn.agent, path, mode, parents));
    let mut written = 0u64;
    loop {
        match conn.read_input(id)? {
            Input::Data(chunk) => {
                if let Ok(tmp) = &mut state {
                    match tmp.file.write_all(&chunk) {
                        Ok(()) => written += chunk.len() as u64,
                        // The temporary file goes (dropped here, before the rest of
                        // the data is drained), so a full disk is freed at once and
                        // nothing half-written is ever at `path`.
                        Err(e) => state = Err(write_error(path, &e)),
                    }
                }
            }
            Input::End => break,
            other => {
                return Err(conn.refuse(
                    ErrorKind::Protocol,
                    format!("{other:?} during a file write"),
                ));
            }
        }
    }
    let answer = state.and_then(|tmp| finish_write(tmp, path, mode));
    drop(acting);
    match answer {
        Ok(()) => conn.send(id, AgentBody::Written { bytes: written }),
        Err(e) => conn.send_error(id, e),
    }
}

/// Makes `dir` and its missing parents, each with mode 0755 whatever the agent's
/// umask (owned by whoever the thread acts as).
pub(crate) fn make_dirs(dir: &Path) -> io::Result<()> {
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|d| !d.as_os_str().is_empty() && fs::symlink_metadata(d).is_err())
        .collect();
    for d in missing.into_iter().rev() {
        match fs::DirBuilder::new().mode(0o755).create(d) {
            Ok(()) => fs::set_permissions(d, fs::Permissions::from_mode(0o755))?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The calling thread acting as `user` on files (nothing when `None`), for the
/// duration of the guard.
pub(crate) fn as_account(user: Option<&Account>) -> Result<Option<ActingAs>, WireError> {
    match accounts::take(user)? {
        Some(id) => id.act().map(Some),
        None => Ok(None),
    }
}

/// A failed write of `path`: a full disk (the sandbox's disk limit) or a file over a
/// size limit is [`ErrorKind::NoSpace`], so a client can tell it from a broken agent.
pub(crate) fn write_error(path: &str, e: &io::Error) -> WireError {
    match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG) => WireError::new(
            ErrorKind::NoSpace,
            format!("write {path}: {e} (the sandbox's disk limit is reached)"),
        ),
        _ => io_error(&format!("write {path}"), e),
    }
}

fn begin_write(
    agent: &Agent,
    path: &str,
    mode: Option<u32>,
    parents: bool,
) -> Result<TempFile, WireError> {
    let target = resolve(agent, path)?;
    let err = |e: io::Error| io_error(&format!("write {path}"), &e);
    let (Some(dir), Some(name)) = (target.parent(), target.file_name()) else {
        return Err(WireError::new(
            ErrorKind::InvalidArgument,
            format!("write {path}: not a file path"),
        ));
    };
    if let Some(m) = mode {
        if m > 0o7777 {
            return Err(WireError::new(
                ErrorKind::InvalidArgument,
                format!("mode {m:o} out of range"),
            ));
        }
    }
    if parents {
        make_dirs(dir).map_err(err)?;
    }
    if fs::metadata(&target).is_ok_and(|m| m.is_dir()) {
        return Err(WireError::new(
            ErrorKind::IsADirectory,
            format!("write {path}: is a directory"),
        ));
    }
    // The name must be new to the directory, whatever it holds: a sandbox's files
    // outlive its agent (a snapshot taken during a write carries that write's
    // temporary file into the next execution, whose agent has the same PID in its
    // namespace and counts from 0 again), so the name carries random bits too, and a
    // name that is taken is never reused.
    let mut attempt = 0;
    loop {
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut salt = [0u8; 8];
        let _ = rustix::rand::getrandom(&mut salt, rustix::rand::GetRandomFlags::empty());
        let tmp = dir.join(space_proto::guest::temp_files::temp_name(
            &name.to_string_lossy(),
            std::process::id(),
            n,
            u64::from_ne_bytes(salt),
        ));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
        {
            Ok(file) => {
                return Ok(TempFile {
                    path: tmp,
                    target,
                    file,
                    done: false,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 8 => attempt += 1,
            Err(e) => return Err(err(e)),
        }
    }
}

fn finish_write(mut tmp: TempFile, path: &str, mode: Option<u32>) -> Result<(), WireError> {
    let err = |e: io::Error| write_error(path, &e);
    let target = tmp.target.clone();
    // An existing file keeps its permissions unless the client names new ones.
    let mode = mode.unwrap_or_else(|| {
        fs::metadata(&target)
            .map(|m| m.permissions().mode() & 0o7777)
            .unwrap_or(0o644)
    });
    tmp.file
        .set_permissions(fs::Permissions::from_mode(mode))
        .map_err(err)?;
    tmp.file.sync_all().map_err(err)?;
    fs::rename(&tmp.path, &target).map_err(err)?;
    tmp.done = true;
    if let Some(dir) = target.parent() {
        File::open(dir).and_then(|d| d.sync_all()).map_err(err)?;
    }
    Ok(())
}
