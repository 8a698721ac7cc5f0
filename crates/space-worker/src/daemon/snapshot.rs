//! A sandbox's writable layer as an archive: what a snapshot holds and what moves a
//! sandbox to another worker.
//!
//! A tar stream of the overlay's upper directory: directories, regular files and
//! symlinks with modes, owners and times; overlayfs whiteouts (0:0 character devices)
//! marked with a `SPACE.whiteout` PAX record (tar readers would unpack them as plain
//! files); and the `trusted.overlay.*` extended attributes (opaque directories) as
//! `SCHILY.xattr` PAX records. Integrity and authenticity come from outside: the
//! control plane signs the archive's BLAKE3 digest, and the receiver checks both
//! before unpacking anything.

/// Largest archive a worker produces or accepts.
pub const MAX_ARCHIVE: u64 = 1 << 30;

/// The PAX record that marks an overlayfs whiteout.
const WHITEOUT_KEY: &str = "SPACE.whiteout";

/// `MAX_ARCHIVE` (or any limit) in words, for errors.
fn size_words(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    if bytes >= GIB && bytes % GIB == 0 {
        format!("{} GiB", bytes / GIB)
    } else if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    }
}

/// BLAKE3 of `bytes`, lowercase hex.
pub fn digest(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

mod pack;
pub mod sparse;
#[cfg(test)]
mod tests;
pub mod transfer;
mod unpack;

pub use pack::{
    MAX_DEPTH, Packed, pack, pack_into, pack_to_temp, pack_to_temp_keeping_holes, tempfile_in,
};
pub use unpack::{unpack, unpack_keeping_holes};
