//! The one error of building a jail: which step failed and why.

use std::fmt;
use std::path::Path;

use crate::spec::StatusEvent;

/// A step of building the jail failed; reported to the worker as
/// [`StatusEvent::Error`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JailError {
    /// Which step, e.g. `mount overlay`.
    pub stage: String,
    /// The OS error or reason.
    pub message: String,
}

impl JailError {
    /// An error at `stage`.
    pub fn new(stage: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            stage: stage.into(),
            message: message.into(),
        }
    }

    /// An I/O error on `path` at `stage`.
    pub fn io(stage: impl Into<String>, path: &Path, err: std::io::Error) -> Self {
        Self::new(stage, format!("{}: {err}", path.display()))
    }

    /// The status event carrying this error.
    pub fn to_event(&self) -> StatusEvent {
        StatusEvent::Error {
            stage: self.stage.clone(),
            message: self.message.clone(),
        }
    }
}

impl fmt::Display for JailError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.stage, self.message)
    }
}

impl std::error::Error for JailError {}
