//! Files with holes in an archive, for the archives that carry VM disks (a disk
//! image is mostly holes; as plain data a 1 GiB disk would be a 1 GiB archive). The
//! entry's data is only the file's data extents, in order; a PAX record
//! [`SPARSE_KEY`] = `REAL;OFF:LEN,OFF:LEN,…` says where each goes and the file's
//! length. Only archives packed to keep holes carry it, and only an unpack told to
//! accept it reads it: everywhere else such an entry is refused (read as plain data,
//! the extents would be a different file).

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;

/// The PAX record of a file with holes.
pub const SPARSE_KEY: &str = "SPACE.sparse";
/// Most data extents one file may have in an archive; past it the file goes as
/// plain data (its holes as zeros).
pub const MAX_EXTENTS: usize = 65_536;
/// Largest file (its apparent length) an archive may say a sparse entry is.
pub const MAX_REAL: u64 = 1 << 40;

/// The data extents `(offset, length)` of `f` (of length `len`), in order, or `None`
/// when it has more than [`MAX_EXTENTS`] (or the filesystem cannot say).
pub fn data_extents(f: &File, len: u64) -> io::Result<Option<Vec<(u64, u64)>>> {
    use rustix::fs::{SeekFrom, seek};
    let mut extents = Vec::new();
    let mut at = 0u64;
    while at < len {
        let start = match seek(f, SeekFrom::Data(at)) {
            Ok(s) => s,
            Err(rustix::io::Errno::NXIO) => break,
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::OPNOTSUPP) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if start >= len {
            break;
        }
        let end = seek(f, SeekFrom::Hole(start))?.min(len);
        if end <= start {
            return Ok(None);
        }
        if extents.len() == MAX_EXTENTS {
            return Ok(None);
        }
        extents.push((start, end - start));
        at = end;
    }
    Ok(Some(extents))
}

/// The record's value for a file of `real` bytes with `extents`.
pub fn encode_map(real: u64, extents: &[(u64, u64)]) -> String {
    let list: Vec<String> = extents.iter().map(|(o, l)| format!("{o}:{l}")).collect();
    format!("{real};{}", list.join(","))
}

fn bad(why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("a malformed sparse record in the layer archive: {why}"),
    )
}

/// Parses a record for an entry of `data_len` bytes: the file's length and its
/// extents, which must be in order, apart, inside the file, at most
/// [`MAX_EXTENTS`], and together exactly the entry's data.
pub fn decode_map(value: &[u8], data_len: u64) -> io::Result<(u64, Vec<(u64, u64)>)> {
    let text = std::str::from_utf8(value).map_err(|_| bad("not text"))?;
    let (real, list) = text.split_once(';').ok_or_else(|| bad("no length"))?;
    let real: u64 = real.parse().map_err(|_| bad("its length"))?;
    if real > MAX_REAL {
        return Err(bad("the file is longer than 1 TiB"));
    }
    let mut extents = Vec::new();
    let mut end = 0u64;
    let mut total = 0u64;
    for item in list.split(',').filter(|i| !i.is_empty()) {
        if extents.len() == MAX_EXTENTS {
            return Err(bad("too many extents"));
        }
        let (o, l) = item.split_once(':').ok_or_else(|| bad("an extent"))?;
        let (o, l): (u64, u64) = (
            o.parse().map_err(|_| bad("an offset"))?,
            l.parse().map_err(|_| bad("a length"))?,
        );
        let stop = o.checked_add(l).ok_or_else(|| bad("an extent"))?;
        if l == 0 || o < end || stop > real {
            return Err(bad("extents out of order, overlapping or past the end"));
        }
        end = stop;
        total += l;
        extents.push((o, l));
    }
    if total != data_len {
        return Err(bad("its extents are not the entry's data"));
    }
    Ok((real, extents))
}

/// Reads `f`'s extents one after another (exactly their total length: zeros past
/// what the file still holds).
#[derive(Debug)]
pub struct ExtentReader {
    file: File,
    extents: Vec<(u64, u64)>,
    next: usize,
    done: u64,
}

impl ExtentReader {
    /// A reader of `extents` of `file`.
    pub fn new(file: File, extents: Vec<(u64, u64)>) -> Self {
        Self {
            file,
            extents,
            next: 0,
            done: 0,
        }
    }
}

impl Read for ExtentReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(&(off, len)) = self.extents.get(self.next) else {
            return Ok(0);
        };
        let want = usize::try_from(len - self.done)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let mut n = self.file.read_at(&mut buf[..want], off + self.done)?;
        if n == 0 {
            buf[..want].fill(0);
            n = want;
        }
        self.done += n as u64;
        if self.done == len {
            self.next += 1;
            self.done = 0;
        }
        Ok(n)
    }
}

/// Writes the entry's data (`data`, the extents one after another) into `file` at
/// the extents' offsets, then sets its length: the holes stay holes.
pub fn write_extents(
    data: &mut impl Read,
    file: &File,
    real: u64,
    extents: &[(u64, u64)],
) -> io::Result<()> {
    let mut buf = vec![0u8; 256 << 10];
    for &(off, len) in extents {
        let mut done = 0u64;
        while done < len {
            let want = usize::try_from(len - done)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            let n = data.read(&mut buf[..want])?;
            if n == 0 {
                return Err(bad("the entry's data ended early"));
            }
            file.write_all_at(&buf[..n], off + done)?;
            done += n as u64;
        }
    }
    file.set_len(real)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparse_record_must_describe_exactly_the_entrys_data_inside_the_file() {
        assert_eq!(
            decode_map(b"100;0:4,90:10", 14).unwrap(),
            (100, vec![(0, 4), (90, 10)])
        );
        assert_eq!(decode_map(b"100;", 0).unwrap(), (100, vec![]));
        for (bad, len) in [
            (&b"100;0:4,2:4"[..], 8),  // overlapping
            (b"100;10:4,0:4", 8),      // out of order
            (b"100;95:10", 10),        // past the end
            (b"100;0:4", 5),           // not the entry's data
            (b"100;0:0", 0),           // an empty extent
            (b"2000000000000;0:1", 1), // longer than 1 TiB
            (b"x;0:1", 1),
            (b"100", 0),
            (b"100;18446744073709551615:2", 2), // overflows
        ] {
            assert!(
                decode_map(bad, len).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(encode_map(100, &[(0, 4), (90, 10)]), "100;0:4,90:10");
    }
}
