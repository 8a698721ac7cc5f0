//! Layer decompression, chosen by the stream's magic bytes (a media type can lie, and
//! `docker save` layers are plain tar whatever they were pushed as): gzip (any number
//! of members), zstd (any number of frames, skippable frames skipped) or plain tar.

use std::cell::Cell;
use std::io::{self, BufRead, BufReader, Read};

use flate2::bufread::MultiGzDecoder;
use ruzstd::decoding::FrameDecoder;

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar stream.
    None,
    /// gzip.
    Gzip,
    /// zstd.
    Zstd,
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Reads the first bytes of `r` (without consuming them) to tell its compression.
///
/// `r` is a file or an archive member behind a [`BufReader`]: its first fill holds
/// far more than the four bytes a magic needs (a stream shorter than that is no
/// compressed stream).
pub fn detect<R: BufRead>(r: &mut R) -> io::Result<Compression> {
    let head = r.fill_buf()?;
    Ok(if head.starts_with(&ZSTD_MAGIC) {
        Compression::Zstd
    } else if head.starts_with(&GZIP_MAGIC) {
        Compression::Gzip
    } else {
        Compression::None
    })
}

/// The decompressed stream of `r`.
pub fn decompress<'a, R: BufRead + 'a>(mut r: R) -> io::Result<Box<dyn Read + 'a>> {
    Ok(match detect(&mut r)? {
        Compression::None => Box::new(r),
        Compression::Gzip => Box::new(MultiGzDecoder::new(r)),
        Compression::Zstd => Box::new(ZstdFrames::new(r)),
    })
}

/// A zstd stream of one or more frames.
struct ZstdFrames<R> {
    source: R,
    frame: FrameDecoder,
    in_frame: bool,
}

impl<R: BufRead> ZstdFrames<R> {
    fn new(source: R) -> Self {
        Self {
            source,
            frame: FrameDecoder::new(),
            in_frame: false,
        }
    }

    /// Starts the next frame; false at the end of the stream.
    fn next_frame(&mut self) -> io::Result<bool> {
        loop {
            let head = self.source.fill_buf()?;
            if head.is_empty() {
                return Ok(false);
            }
            let mut magic = [0u8; 4];
            if head.len() >= 8 {
                magic.copy_from_slice(&head[..4]);
                // Skippable frames: magic 0x184D2A5? and a 4-byte length.
                if u32::from_le_bytes(magic) & 0xffff_fff0 == 0x184d_2a50 {
                    let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
                    self.source.consume(8);
                    let skipped = io::copy(
                        &mut (&mut self.source).take(u64::from(len)),
                        &mut io::sink(),
                    )?;
                    if skipped != u64::from(len) {
                        return Err(bad("zstd: truncated skippable frame"));
                    }
                    continue;
                }
            }
            self.frame
                .init(&mut self.source)
                .map_err(io::Error::other)?;
            self.in_frame = true;
            return Ok(true);
        }
    }
}

fn bad(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_owned())
}

impl<R: BufRead> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if !self.in_frame && !self.next_frame()? {
                return Ok(0);
            }
            while self.frame.can_collect() < buf.len() && !self.frame.is_finished() {
                let want = buf.len() - self.frame.can_collect();
                self.frame
                    .decode_blocks(
                        &mut self.source,
                        ruzstd::decoding::BlockDecodingStrategy::UptoBytes(want),
                    )
                    .map_err(io::Error::other)?;
            }
            let n = self.frame.read(buf)?;
            if n > 0 {
                return Ok(n);
            }
            if self.frame.is_finished() {
                self.in_frame = false;
            }
        }
    }
}

/// A decompressed stream cut at `limit` bytes: a read that would pass it fails (and
/// hands on none of its bytes), and `over` is set, so that the caller — behind a tar
/// reader and an unpacker that turn the error into their own — tells the bound from a
/// broken stream. What is behind the bound is never decompressed further.
pub(crate) struct Bounded<'a, R> {
    inner: R,
    left: u64,
    over: &'a Cell<bool>,
}

impl<'a, R: Read> Bounded<'a, R> {
    pub(crate) fn new(inner: R, limit: u64, over: &'a Cell<bool>) -> Self {
        Self {
            inner,
            left: limit,
            over,
        }
    }
}

impl<R: Read> Read for Bounded<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.over.get() {
            return Err(past_bound());
        }
        // One byte more than is left tells a stream that goes on from one that ends.
        let cap = usize::try_from(self.left.saturating_add(1))
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = self.inner.read(&mut buf[..cap])?;
        if n as u64 > self.left {
            self.over.set(true);
            return Err(past_bound());
        }
        self.left -= n as u64;
        Ok(n)
    }
}

fn past_bound() -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        "the layer unpacks to more than its bound",
    )
}

/// A buffered reader of the capacity the unpacker uses.
pub fn buffered<R: Read>(r: R) -> BufReader<R> {
    BufReader::with_capacity(256 << 10, r)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn all(r: impl BufRead) -> Vec<u8> {
        let mut out = Vec::new();
        decompress(r)
            .and_then(|mut d| d.read_to_end(&mut out))
            .unwrap_or_else(|e| panic!("decompress: {e}"));
        out
    }

    #[test]
    fn plain_gzip_and_zstd_streams_are_told_apart_by_their_magic() {
        let data: Vec<u8> = (0..200_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&data).unwrap_or_else(|e| panic!("{e}"));
        let gz = gz.finish().unwrap_or_else(|e| panic!("{e}"));
        let zst = ruzstd::encoding::compress_to_vec(
            &data[..],
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        assert_eq!(all(&data[..]), data);
        assert_eq!(all(&gz[..]), data);
        assert_eq!(all(&zst[..]), data);
    }

    #[test]
    fn a_bounded_stream_gives_up_to_its_bound_and_fails_one_byte_past_it() {
        let data = vec![7u8; 10_000];
        let over = Cell::new(false);
        let mut out = Vec::new();
        let n = Bounded::new(&data[..], 10_000, &over)
            .read_to_end(&mut out)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((n, over.get()), (10_000, false));
        let mut out = Vec::new();
        let e = Bounded::new(&data[..], 9_999, &over)
            .read_to_end(&mut out)
            .map_or_else(|e| e.kind(), |n| panic!("read {n} bytes past the bound"));
        assert_eq!(e, io::ErrorKind::FileTooLarge);
        assert!(
            over.get() && out.len() <= 9_999,
            "{} bytes handed on",
            out.len()
        );
    }

    #[test]
    fn several_zstd_frames_and_a_skippable_one_make_one_stream() {
        let level = ruzstd::encoding::CompressionLevel::Fastest;
        let mut zst = ruzstd::encoding::compress_to_vec(&b"first "[..], level);
        zst.extend_from_slice(&0x184d_2a53u32.to_le_bytes());
        zst.extend_from_slice(&3u32.to_le_bytes());
        zst.extend_from_slice(b"xyz");
        zst.extend(ruzstd::encoding::compress_to_vec(&b"second"[..], level));
        assert_eq!(all(&zst[..]), b"first second");
    }
}
