//! Connections (created private, refused when open to others) and the small SQL
//! helpers every query uses.

use std::borrow::Cow;
use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags, Row, ToSql};

use crate::error::StoreError;
use crate::rows::Cols;

/// How long a statement waits for another connection's write lock before failing.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// The parameters of one statement.
pub(super) type Params<'a> = &'a [&'a dyn ToSql];

pub(super) fn open_connection(path: &Path) -> Result<Connection, StoreError> {
    // A fresh data directory is the normal first start of `space up`.
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| StoreError::Backend(format!("create {}: {e}", parent.display())))?;
    }
    create_private(path)?;
    let conn = Connection::open(path).map_err(sqlite_err)?;
    // Set first: switching to WAL itself may have to wait for another connection.
    conn.busy_timeout(BUSY_TIMEOUT).map_err(sqlite_err)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(sqlite_err)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Backend(format!(
            "{} refused WAL mode (journal mode is {mode})",
            path.display()
        )));
    }
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")
        .map_err(sqlite_err)?;
    Ok(conn)
}

/// Creates the database file 0600 before SQLite opens it (SQLite gives its `-wal`,
/// `-shm` and `-journal` files the database's mode), so the seeds and secrets it will
/// hold are never readable by others, not even for a moment; refuses an existing file
/// that group or others can read or write.
pub(super) fn create_private(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|e| StoreError::Backend(format!("open {}: {e}", path.display())))?;
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let file = Path::new(&name);
        let Ok(meta) = std::fs::metadata(file) else {
            continue;
        };
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(StoreError::Backend(format!(
                "{} is open to group or others (mode {mode:04o}); it holds the platform's \
                 signing seeds and secrets: run `chmod 600 {}`",
                file.display(),
                file.display()
            )));
        }
    }
    Ok(())
}

/// A read-only connection to a database the writer has opened (and put in WAL mode).
pub(super) fn open_reader(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sqlite_err)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(sqlite_err)?;
    conn.execute_batch("PRAGMA foreign_keys = ON;")
        .map_err(sqlite_err)?;
    Ok(conn)
}

/// `$n` → `?n`: the same numbered parameter in SQLite's syntax. The shared SQL has no
/// `$` anywhere else.
pub(super) fn dollar_to_question(sql: &str) -> Cow<'_, str> {
    if sql.contains('$') {
        Cow::Owned(sql.replace('$', "?"))
    } else {
        Cow::Borrowed(sql)
    }
}

/// Runs a statement; the number of rows it changed.
pub(super) fn exec(c: &Connection, sql: &str, params: Params) -> Result<u64, StoreError> {
    c.prepare_cached(&dollar_to_question(sql))
        .and_then(|mut s| s.execute(params))
        .map(|n| n as u64)
        .map_err(sqlite_err)
}

pub(super) fn exists(c: &Connection, sql: &str, params: Params) -> Result<bool, StoreError> {
    c.prepare_cached(&dollar_to_question(sql))
        .and_then(|mut s| s.exists(params))
        .map_err(sqlite_err)
}

pub(super) fn query_all<T>(
    c: &Connection,
    sql: &str,
    params: Params,
    decode: impl Fn(&Row<'_>) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let mut stmt = c
        .prepare_cached(&dollar_to_question(sql))
        .map_err(sqlite_err)?;
    let mut rows = stmt.query(params).map_err(sqlite_err)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(sqlite_err)? {
        out.push(decode(row)?);
    }
    Ok(out)
}

pub(super) fn query_one<T>(
    c: &Connection,
    sql: &str,
    params: Params,
    decode: impl Fn(&Row<'_>) -> Result<T, StoreError>,
) -> Result<Option<T>, StoreError> {
    let mut stmt = c
        .prepare_cached(&dollar_to_question(sql))
        .map_err(sqlite_err)?;
    let mut rows = stmt.query(params).map_err(sqlite_err)?;
    rows.next().map_err(sqlite_err)?.map(decode).transpose()
}

pub(super) fn one_row(changed: u64, what: impl FnOnce() -> String) -> Result<(), StoreError> {
    if changed == 0 {
        Err(StoreError::NotFound(what()))
    } else {
        Ok(())
    }
}

/// Unique and primary-key violations are `Conflict`; a missing referenced row (foreign
/// key) is `NotFound`; everything else is the backend's business.
pub(super) fn sqlite_err(e: rusqlite::Error) -> StoreError {
    let rusqlite::Error::SqliteFailure(f, msg) = &e else {
        return StoreError::Backend(e.to_string());
    };
    if f.code != ErrorCode::ConstraintViolation {
        return StoreError::Backend(e.to_string());
    }
    let detail = msg.clone().unwrap_or_else(|| e.to_string());
    match f.extended_code {
        rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE | rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY => {
            StoreError::Conflict(detail)
        }
        rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY => {
            StoreError::NotFound(format!("referenced row ({detail})"))
        }
        _ => StoreError::Backend(detail),
    }
}

impl Cols for Row<'_> {
    fn text(&self, i: usize) -> Result<String, StoreError> {
        self.get(i).map_err(sqlite_err)
    }
    fn opt_text(&self, i: usize) -> Result<Option<String>, StoreError> {
        self.get(i).map_err(sqlite_err)
    }
    fn int(&self, i: usize) -> Result<i64, StoreError> {
        self.get(i).map_err(sqlite_err)
    }
    fn opt_int(&self, i: usize) -> Result<Option<i64>, StoreError> {
        self.get(i).map_err(sqlite_err)
    }
    fn blob(&self, i: usize) -> Result<Vec<u8>, StoreError> {
        self.get(i).map_err(sqlite_err)
    }
    fn boolean(&self, i: usize) -> Result<bool, StoreError> {
        self.get(i).map_err(sqlite_err)
    }
}
