//! The driver's errors as the store's.

use tokio_postgres::error::SqlState;

use crate::error::StoreError;

/// Unique violations are `Conflict`; a missing referenced row (foreign key) is
/// `NotFound`; everything else is the backend's business.
pub(super) fn pg_err(e: tokio_postgres::Error) -> StoreError {
    let Some(db) = e.as_db_error() else {
        return StoreError::Backend(e.to_string());
    };
    let detail = db.message().to_owned();
    match *db.code() {
        SqlState::UNIQUE_VIOLATION => StoreError::Conflict(detail),
        SqlState::FOREIGN_KEY_VIOLATION => {
            StoreError::NotFound(format!("referenced row ({detail})"))
        }
        _ => StoreError::Backend(format!("{detail} (SQLSTATE {})", db.code().code())),
    }
}
