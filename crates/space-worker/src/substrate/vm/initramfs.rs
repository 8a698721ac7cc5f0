//! The guest's initramfs, written here (no `cpio` on the host): the newc format the
//! kernel unpacks, uncompressed (decompressing under software emulation costs more
//! than the bytes). It holds `/init` (the statically linked agent), the kernel modules
//! the guest loads, their order, and `/dev/console` for the init's output.

use std::io::{self, Write};
use std::path::Path;

use space_proto::vm;

/// One entry of a newc archive.
struct Entry<'a> {
    name: &'a str,
    mode: u32,
    rdev: (u32, u32),
    data: &'a [u8],
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFCHR: u32 = 0o020000;

/// A newc writer.
struct Newc<W: Write> {
    out: W,
    ino: u32,
    written: u64,
}

impl<W: Write> Newc<W> {
    fn put(&mut self, e: &Entry<'_>) -> io::Result<()> {
        self.ino += 1;
        let size = u32::try_from(e.data.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file over 4 GiB"))?;
        let nlink = if e.mode & S_IFDIR != 0 { 2 } else { 1 };
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            e.mode,
            0,
            0,
            nlink,
            0,
            size,
            0,
            0,
            e.rdev.0,
            e.rdev.1,
            e.name.len() + 1,
            0
        );
        self.raw(header.as_bytes())?;
        self.raw(e.name.as_bytes())?;
        self.raw(&[0])?;
        self.pad()?;
        self.raw(e.data)?;
        self.pad()
    }

    fn raw(&mut self, b: &[u8]) -> io::Result<()> {
        self.out.write_all(b)?;
        self.written += b.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let n = (4 - (self.written % 4) as usize) % 4;
        self.raw(&[0u8; 3][..n])
    }

    fn finish(mut self) -> io::Result<W> {
        self.put(&Entry {
            name: "TRAILER!!!",
            mode: 0,
            rdev: (0, 0),
            data: &[],
        })?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Writes the initramfs: `init` (the agent binary's bytes) as `/init`, and each
/// `(name, bytes)` of `modules` as `MODULES_DIR/name.ko`, listed in that order in
/// `MODULES_DIR/MODULES_ORDER`.
pub fn write(out: impl Write, init: &[u8], modules: &[(String, Vec<u8>)]) -> io::Result<()> {
    let mut w = Newc {
        out,
        ino: 0,
        written: 0,
    };
    let dir = |name| Entry {
        name,
        mode: S_IFDIR | 0o755,
        rdev: (0, 0),
        data: &[],
    };
    for d in ["dev", "proc", "sys", "lib", "lib/space"] {
        w.put(&dir(d))?;
    }
    let modules_dir = vm::MODULES_DIR.trim_start_matches('/');
    w.put(&dir(modules_dir))?;
    w.put(&Entry {
        name: "dev/console",
        mode: S_IFCHR | 0o600,
        rdev: (5, 1),
        data: &[],
    })?;
    w.put(&Entry {
        name: "init",
        mode: S_IFREG | 0o755,
        rdev: (0, 0),
        data: init,
    })?;
    let mut order = String::new();
    for (name, bytes) in modules {
        let path = format!("{modules_dir}/{name}.ko");
        w.put(&Entry {
            name: &path,
            mode: S_IFREG | 0o644,
            rdev: (0, 0),
            data: bytes,
        })?;
        order.push_str(name);
        order.push('\n');
    }
    let order_path = format!("{modules_dir}/{}", vm::MODULES_ORDER);
    w.put(&Entry {
        name: &order_path,
        mode: S_IFREG | 0o644,
        rdev: (0, 0),
        data: order.as_bytes(),
    })?;
    w.finish()?;
    Ok(())
}

/// [`write`] into `path` (through a temporary file renamed into place).
pub fn write_file(path: &Path, init: &[u8], modules: &[(String, Vec<u8>)]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let file = std::fs::File::create(&tmp)?;
    write(io::BufWriter::new(&file), init, modules)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads a newc archive back: (name, mode, data) of each entry before the trailer.
    fn entries(mut b: &[u8]) -> Vec<(String, u32, Vec<u8>)> {
        let mut out = Vec::new();
        let mut offset = 0usize;
        loop {
            assert_eq!(&b[..6], b"070701");
            let field = |i: usize| {
                u32::from_str_radix(std::str::from_utf8(&b[6 + i * 8..14 + i * 8]).unwrap(), 16)
                    .unwrap() as usize
            };
            let (mode, size, namesize) = (field(1), field(6), field(11));
            let name = std::str::from_utf8(&b[110..110 + namesize - 1])
                .unwrap()
                .to_owned();
            let pad = |n: usize| (4 - n % 4) % 4;
            let head = 110 + namesize;
            let data_at = head + pad(offset + head);
            let data = b[data_at..data_at + size].to_vec();
            let end = data_at + size;
            let next = end + pad(offset + end);
            if name == "TRAILER!!!" {
                assert_eq!(next, b.len());
                return out;
            }
            out.push((name, mode as u32, data));
            offset += next;
            b = &b[next..];
        }
    }

    #[test]
    fn the_archive_holds_the_init_the_modules_and_their_order() {
        let mut buf = Vec::new();
        let modules = vec![
            ("virtio".to_owned(), vec![1u8; 5]),
            ("overlay".to_owned(), vec![2u8; 1023]),
        ];
        write(&mut buf, b"#!agent", &modules).unwrap();
        assert_eq!(buf.len() % 4, 0);
        let got = entries(&buf);
        let find = |n: &str| got.iter().find(|e| e.0 == n).cloned().unwrap();
        assert_eq!(
            find("init"),
            ("init".into(), S_IFREG | 0o755, b"#!agent".to_vec())
        );
        assert_eq!(find("lib/space/modules/overlay.ko").2, vec![2u8; 1023]);
        assert_eq!(
            find("lib/space/modules/order").2,
            b"virtio\noverlay\n".to_vec()
        );
        assert_eq!(find("dev/console").1, S_IFCHR | 0o600);
    }
}
