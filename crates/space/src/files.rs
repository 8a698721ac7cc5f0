//! `space fs get` and `space fs put`: files of any size streamed through the edge with
//! the SDK (neither side holds a file whole); with `-r`, directories as tar streams
//! ([`space_tree`]: packed and unpacked by a thread on the far side of a pipe). A download goes to a temporary file
//! beside LOCAL, renamed over it only once every byte of the answer's
//! `Content-Length` arrived; a short read removes it and exits non-zero with a
//! message (to stdout, what arrived was written, and the exit status says it is not
//! all). An upload replaces the sandbox's file only once all of it arrived.

use std::path::Path;

use space_client::{Client, Error, WriteOptions};
use space_identity::SandboxId;
use space_proto::api::User;

fn sandbox(id: &str) -> Result<SandboxId, String> {
    id.parse()
        .map_err(|_| format!("not_found (404): no sandbox {id}"))
}

/// An SDK error as these commands word API errors: `code (status): message [reason]`.
fn describe(e: &Error) -> String {
    match e {
        Error::Api {
            status,
            code,
            message,
            reason,
        } => match reason {
            Some(r) => format!("{code} ({}): {message} [{r}]", status.as_u16()),
            None => format!("{code} ({}): {message}", status.as_u16()),
        },
        other => other.to_string(),
    }
}

/// Stdin or stdout as an asynchronous file (a duplicate of its descriptor, read and
/// written on the blocking pool: a pipe, a terminal or a file alike).
fn std_stream(s: &impl std::os::fd::AsFd) -> Result<tokio::fs::File, String> {
    let fd = s.as_fd().try_clone_to_owned().map_err(|e| e.to_string())?;
    Ok(tokio::fs::File::from_std(std::fs::File::from(fd)))
}

/// `space fs get SANDBOX PATH [LOCAL]`: to LOCAL, or to stdout without one or with `-`.
pub async fn get(c: &Client, id: &str, path: &str, local: Option<&Path>) -> Result<(), String> {
    let id = sandbox(id)?;
    let Some(local) = local.filter(|p| p.as_os_str() != "-") else {
        let mut out = std_stream(&std::io::stdout())?;
        return c
            .read_file_to(&id, path, &mut out)
            .await
            .map(drop)
            .map_err(|e| describe(&e));
    };
    let dir = match local.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let name = local
        .file_name()
        .ok_or_else(|| format!("{}: not a file name", local.display()))?;
    let tmp = dir.join(format!(
        ".{}.space-part.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = async {
        let mut f = tokio::fs::File::create(&tmp)
            .await
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
        c.read_file_to(&id, path, &mut f)
            .await
            .map_err(|e| describe(&e))?;
        f.sync_all()
            .await
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
        tokio::fs::rename(&tmp, local)
            .await
            .map_err(|e| format!("{}: {e}", local.display()))
    }
    .await;
    if result.is_err() {
        let _ = tokio::fs::remove_file(&tmp).await;
    }
    result
}

/// `space fs put SANDBOX LOCAL PATH`: from LOCAL (its mode kept unless `mode` says
/// otherwise), or from stdin with `-`; missing parents in the sandbox are made.
pub async fn put(
    c: &Client,
    id: &str,
    local: &Path,
    path: &str,
    mode: Option<u32>,
    user: Option<User>,
) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let id = sandbox(id)?;
    let mut options = WriteOptions {
        mode,
        user,
        ..WriteOptions::default()
    };
    if local.as_os_str() == "-" {
        let stdin = std_stream(&std::io::stdin())?;
        let body_len = None;
        return write_stdin(c, &id, path, stdin, body_len, &options).await;
    }
    let file = tokio::fs::File::open(local)
        .await
        .map_err(|e| format!("{}: {e}", local.display()))?;
    let meta = file
        .metadata()
        .await
        .map_err(|e| format!("{}: {e}", local.display()))?;
    if meta.is_dir() {
        return Err(format!(
            "{}: is a directory (upload it with `space fs put -r`)",
            local.display()
        ));
    }
    // A script keeps its execute bit: the local mode goes with it (no setuid bits).
    options.mode = options.mode.or(Some(meta.permissions().mode() & 0o777));
    c.write_file_with(&id, path, file, meta.len(), &options)
        .await
        .map(drop)
        .map_err(|e| describe(&e))
}

/// Stdin into `path` (chunked: its length is not known ahead).
async fn write_stdin(
    c: &Client,
    id: &SandboxId,
    path: &str,
    stdin: tokio::fs::File,
    _len: Option<u64>,
    options: &WriteOptions,
) -> Result<(), String> {
    if options == &WriteOptions::default() {
        return c
            .write_file_from_reader(id, path, stdin)
            .await
            .map_err(|e| describe(&e));
    }
    // Options need the length-carrying call: read stdin whole first would be
    // unbounded, so spool it to a temporary file.
    let mut spool = tempfile::tempfile().map_err(|e| format!("spool stdin: {e}"))?;
    let mut from = stdin.into_std().await;
    let len = tokio::task::spawn_blocking(move || {
        let n = std::io::copy(&mut from, &mut spool)?;
        std::io::Seek::rewind(&mut spool)?;
        Ok::<_, std::io::Error>((n, spool))
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("spool stdin: {e}"))?;
    let (n, spool) = len;
    c.write_file_with(id, path, tokio::fs::File::from_std(spool), n, options)
        .await
        .map(drop)
        .map_err(|e| describe(&e))
}

/// A pipe: its read and write ends.
fn pipe() -> Result<(std::fs::File, std::fs::File), String> {
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| format!("pipe: {e}"))?;
    Ok((std::fs::File::from(r), std::fs::File::from(w)))
}

/// `space fs put -r SANDBOX LOCAL_DIR REMOTE_DIR`: LOCAL_DIR packed as a tar stream
/// (by a thread, into a pipe) and unpacked by the agent into REMOTE_DIR.
pub async fn put_tree(
    c: &Client,
    id: &str,
    local: &Path,
    remote: &str,
    user: Option<User>,
) -> Result<(), String> {
    let id = sandbox(id)?;
    let root = space_tree::open_dir(local).map_err(|e| e.to_string())?;
    let (read_end, mut write_end) = pipe()?;
    let packer = std::thread::spawn(move || {
        let packed = space_tree::pack(
            std::os::fd::AsFd::as_fd(&root),
            &mut write_end,
            space_tree::DEFAULT_MAX_ENTRIES,
        );
        drop(write_end);
        packed
    });
    let sent = c
        .write_tree_from(
            &id,
            remote,
            tokio::fs::File::from_std(read_end),
            user.as_ref(),
        )
        .await;
    let packed = packer
        .join()
        .map_err(|_| "the packing thread failed".to_owned())?;
    // A packing failure explains a refused or cut upload better than the upload's.
    packed.map_err(|e| format!("{}: {e}", local.display()))?;
    sent.map_err(|e| describe(&e))
}

/// `space fs get -r SANDBOX REMOTE_DIR LOCAL_DIR`: the sandbox's tar stream unpacked
/// into LOCAL_DIR (made if missing) by a thread reading a pipe. The archive is the
/// sandbox's, so hostile: nothing is written outside LOCAL_DIR (no absolute names, no
/// `..`, nothing through a symlink, no devices) and setuid bits are dropped.
pub async fn get_tree(
    c: &Client,
    id: &str,
    remote: &str,
    local: Option<&Path>,
) -> Result<(), String> {
    let id = sandbox(id)?;
    let local = local.ok_or_else(|| "fs get -r needs a local directory".to_owned())?;
    std::fs::create_dir_all(local).map_err(|e| format!("{}: {e}", local.display()))?;
    let root = space_tree::open_dir(local).map_err(|e| e.to_string())?;
    let (read_end, write_end) = pipe()?;
    let unpacker = std::thread::spawn(move || {
        let limits = space_tree::Limits {
            strip_special_bits: true,
            ..space_tree::Limits::default()
        };
        let unpacked = space_tree::unpack(&read_end, std::os::fd::AsFd::as_fd(&root), limits);
        // Drain what is left, so the download is not stalled by a full pipe.
        let _ = std::io::copy(&mut &read_end, &mut std::io::sink());
        unpacked
    });
    let mut sink = tokio::fs::File::from_std(write_end);
    let read = c.read_tree_to(&id, remote, &mut sink).await;
    drop(sink);
    let unpacked = unpacker
        .join()
        .map_err(|_| "the unpacking thread failed".to_owned())?;
    read.map_err(|e| describe(&e))?;
    unpacked
        .map(drop)
        .map_err(|e| format!("{}: {e}", local.display()))
}
