//! The one error of every store call.

/// Why a store call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The named row does not exist (or a row it refers to does not).
    #[error("{0} not found")]
    NotFound(String),
    /// A unique key is taken, or a compare-and-set found another value.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The database failed or holds something this build cannot read.
    #[error("database: {0}")]
    Backend(String),
}
