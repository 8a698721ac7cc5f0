//! `space fs get` and `space fs put`: files of any size streamed through the edge with
//! the SDK (neither side holds a file whole). A download goes to a temporary file
//! beside LOCAL, renamed over it only once every byte of the answer's
//! `Content-Length` arrived; a short read removes it and exits non-zero with a
//! message (to stdout, what arrived was written, and the exit status says it is not
//! all). An upload replaces the sandbox's file only once all of it arrived.

use std::path::Path;

use space_client::{Client, Error};
use space_identity::SandboxId;

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

/// `space fs put SANDBOX LOCAL PATH`: from LOCAL, or from stdin with `-`.
pub async fn put(c: &Client, id: &str, local: &Path, path: &str) -> Result<(), String> {
    let id = sandbox(id)?;
    let r = if local.as_os_str() == "-" {
        c.write_file_from_reader(&id, path, std_stream(&std::io::stdin())?)
            .await
    } else {
        c.write_file_from_path(&id, path, local).await.map(drop)
    };
    r.map_err(|e| describe(&e))
}
