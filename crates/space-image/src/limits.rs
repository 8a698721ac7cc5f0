//! Every bound the importer and the unpacker hold to.

/// The largest JSON document read (an index, a manifest, an image config, our own
/// manifest or a name record).
pub const MAX_JSON: u64 = 4 << 20;

/// The most layers an image may have.
pub const MAX_LAYERS: usize = 128;

/// The most tar entries (extension headers included) in one layer.
pub const MAX_ENTRIES_PER_LAYER: u64 = 1 << 20;

/// The most members in an image archive (a tar of an OCI layout or a `docker save`).
pub const MAX_ARCHIVE_MEMBERS: usize = 1 << 16;

/// The longest path, or link target, of a layer entry (bytes; Linux's `PATH_MAX`).
pub const MAX_PATH: usize = 4096;

/// The largest PAX extension header of one entry.
pub const MAX_PAX: u64 = 64 << 10;

/// How deep an OCI index may nest indexes.
pub const MAX_INDEX_DEPTH: usize = 4;

/// The default bound on uids and gids in a layer: the size of a sandbox's id range
/// (ids at or above it would map outside the sandbox's user namespace).
pub const DEFAULT_ID_LIMIT: u64 = 65_536;
