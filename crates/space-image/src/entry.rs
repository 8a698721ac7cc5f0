//! Tar members, assembled with bounds: the `tar` crate reads GNU long names and PAX
//! headers into memory whatever size their header claims, so they are read here, in
//! raw mode, and refused past [`MAX_PATH`] / [`MAX_PAX`].

use std::io::Read;

use tar::EntryType;

use crate::error::{ImageError, Result};
use crate::limits::{MAX_PATH, MAX_PAX};

/// What a member is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
    Symlink,
    HardLink,
    Fifo,
    CharDevice,
    BlockDevice,
}

/// A member's header, with its long name, long link name and PAX records applied.
#[derive(Debug)]
pub(crate) struct Member {
    /// The path, as the archive spells it.
    pub path: Vec<u8>,
    pub kind: Kind,
    /// The target of a symlink or hard link.
    pub link: Vec<u8>,
    pub uid: u64,
    pub gid: u64,
    pub mode: u32,
    pub mtime: i64,
    /// The data's length.
    pub size: u64,
}

impl Member {
    /// The path for messages.
    pub fn name(&self) -> String {
        shown(&self.path)
    }
}

/// A PAX record: its key and its value.
pub(crate) type PaxRecord<'a> = (&'a [u8], &'a [u8]);

/// The records of a PAX extended header: `LEN key=value\n`, each `LEN` bytes long
/// (read by length: an xattr's value, such as overlayfs's `trusted.overlay.origin`
/// file handle, is binary and may hold any byte, a newline too).
pub(crate) fn pax_records(mut data: &[u8]) -> std::result::Result<Vec<PaxRecord<'_>>, String> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let bad = || "a malformed record".to_owned();
        let space = data.iter().position(|&b| b == b' ').ok_or_else(bad)?;
        let len: usize = std::str::from_utf8(&data[..space])
            .ok()
            .and_then(|n| n.parse().ok())
            .ok_or_else(bad)?;
        if len <= space + 1 || len > data.len() || data[len - 1] != b'\n' {
            return Err(bad());
        }
        let record = &data[space + 1..len - 1];
        let eq = record.iter().position(|&b| b == b'=').ok_or_else(bad)?;
        out.push((&record[..eq], &record[eq + 1..]));
        data = &data[len..];
    }
    Ok(out)
}

/// Calls `each` with every member of the tar stream `r` and the `tar` entry (a
/// reader of its data), at most `max_entries` of them (extension headers included).
pub(crate) fn for_each<R: Read>(
    r: R,
    layer: &str,
    max_entries: u64,
    mut each: impl FnMut(Member, &mut tar::Entry<'_, R>) -> Result<()>,
) -> Result<()> {
    let bad = |why: String| ImageError::Layer {
        layer: layer.to_owned(),
        why,
    };
    let mut archive = tar::Archive::new(r);
    let entries = archive
        .entries()
        .map_err(|e| bad(format!("not a tar stream: {e}")))?
        .raw(true);
    let mut long_name: Option<Vec<u8>> = None;
    let mut long_link: Option<Vec<u8>> = None;
    let mut pax: Option<Vec<u8>> = None;
    let mut count = 0u64;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(format!("not a tar stream: {e}")))?;
        count += 1;
        if count > max_entries {
            return Err(ImageError::limit(
                format!("layer {layer}: the number of tar entries"),
                max_entries,
            ));
        }
        let header = entry.header();
        let size = header
            .entry_size()
            .map_err(|e| bad(format!("entry size: {e}")))?;
        let kind = header.entry_type();
        let ext = |limit: u64, what: &str, entry: &mut dyn Read| -> Result<Vec<u8>> {
            if size > limit {
                return Err(ImageError::limit(format!("layer {layer}: a {what}"), limit));
            }
            let mut v = Vec::with_capacity(size as usize);
            entry
                .read_to_end(&mut v)
                .map_err(|e| bad(format!("{what}: {e}")))?;
            Ok(v)
        };
        match kind {
            EntryType::GNULongName => {
                let mut v = ext(MAX_PATH as u64 + 1, "long name", &mut entry)?;
                strip_nul(&mut v);
                long_name = Some(v);
                continue;
            }
            EntryType::GNULongLink => {
                let mut v = ext(MAX_PATH as u64 + 1, "long link name", &mut entry)?;
                strip_nul(&mut v);
                long_link = Some(v);
                continue;
            }
            EntryType::XHeader => {
                pax = Some(ext(MAX_PAX, "PAX header", &mut entry)?);
                continue;
            }
            // Global PAX headers (`git archive` writes one with a comment) change no
            // field we use; their data is skipped unread.
            EntryType::XGlobalHeader => continue,
            _ => {}
        }
        let (mut path, mut link) = (
            long_name
                .take()
                .unwrap_or_else(|| header.path_bytes().into_owned()),
            long_link
                .take()
                .or_else(|| header.link_name_bytes().map(|l| l.into_owned()))
                .unwrap_or_default(),
        );
        let (mut uid, mut gid) = (
            header.uid().map_err(|e| bad(format!("uid: {e}")))?,
            header.gid().map_err(|e| bad(format!("gid: {e}")))?,
        );
        let mut mtime = header.mtime().map_or(0, |t| t as i64);
        if let Some(records) = pax.take() {
            // Read by length: a record's value (an xattr such as a file capability,
            // a path) may hold any byte, a newline too.
            for (key, value) in
                pax_records(&records).map_err(|why| bad(format!("PAX header: {why}")))?
            {
                let number = || -> Result<u64> {
                    std::str::from_utf8(value)
                        .ok()
                        .and_then(|v| v.split('.').next())
                        .and_then(|v| v.parse().ok())
                        .ok_or_else(|| {
                            bad(format!(
                                "PAX {:?}: not a number",
                                String::from_utf8_lossy(key)
                            ))
                        })
                };
                match key {
                    b"path" => path = value.to_vec(),
                    b"linkpath" => link = value.to_vec(),
                    b"uid" => uid = number()?,
                    b"gid" => gid = number()?,
                    b"mtime" => mtime = i64::try_from(number()?).unwrap_or(i64::MAX),
                    // The data's length is the header's (raw mode): a PAX size that
                    // differs would desynchronise the stream.
                    b"size" if number()? != size => {
                        return Err(bad(format!(
                            "entry {:?}: a PAX size differing from its header's is not \
                             supported",
                            shown(&path)
                        )));
                    }
                    _ if key.starts_with(b"GNU.sparse") => {
                        return Err(bad(format!(
                            "entry {:?}: sparse files are refused",
                            shown(&path)
                        )));
                    }
                    _ => {}
                }
            }
        }
        if path.len() > MAX_PATH {
            return Err(ImageError::limit(
                format!("layer {layer}: an entry's path length"),
                MAX_PATH as u64,
            ));
        }
        if link.len() > MAX_PATH {
            return Err(ImageError::limit(
                format!("layer {layer}: a link target's length"),
                MAX_PATH as u64,
            ));
        }
        let kind = match kind {
            EntryType::Regular | EntryType::Continuous => Kind::File,
            EntryType::Directory => Kind::Dir,
            EntryType::Symlink => Kind::Symlink,
            EntryType::Link => Kind::HardLink,
            EntryType::Fifo => Kind::Fifo,
            EntryType::Char => Kind::CharDevice,
            EntryType::Block => Kind::BlockDevice,
            other => {
                return Err(ImageError::Refused {
                    layer: layer.to_owned(),
                    entry: shown(&path),
                    why: format!("unsupported tar entry type {:?}", other.as_byte() as char),
                });
            }
        };
        let mode = header.mode().map_err(|e| bad(format!("mode: {e}")))?;
        let member = Member {
            path,
            kind,
            link,
            uid,
            gid,
            mode,
            mtime,
            size,
        };
        each(member, &mut entry)?;
    }
    if long_name.is_some() || long_link.is_some() || pax.is_some() {
        return Err(bad("an extension header describes no member".to_owned()));
    }
    Ok(())
}

/// A path for messages (lossy, at most 300 characters).
pub(crate) fn shown(path: &[u8]) -> String {
    String::from_utf8_lossy(path).chars().take(300).collect()
}

fn strip_nul(v: &mut Vec<u8>) {
    while v.last() == Some(&0) {
        v.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pax_value_holding_a_newline_is_read_by_its_length_not_split() {
        // A file capability (binary: a newline in it) and a path with a newline: a
        // reader that splits records on newlines refused such a layer, or worse.
        let mut b = tar::Builder::new(Vec::new());
        let cap: &[u8] = b"\x01\x00\x00\x02\n\x20\x00\x00";
        b.append_pax_extensions([
            ("SCHILY.xattr.security.capability", cap),
            ("path", &b"usr/bin/odd\nname"[..]),
            ("uid", &b"1234"[..]),
        ])
        .unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(2);
        h.set_mode(0o755);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        b.append_data(&mut h, "usr/bin/short", &b"hi"[..]).unwrap();
        let layer = b.into_inner().unwrap();
        let mut seen = Vec::new();
        for_each(&layer[..], "test", 10, |m, _| {
            seen.push((m.path.clone(), m.uid));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, vec![(b"usr/bin/odd\nname".to_vec(), 1234)]);
    }
}
