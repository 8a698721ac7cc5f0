//! Files of a VM uid's (its disk, what its VMM wrote) that the worker reads, copies or
//! takes back: opened without following links, only as plain files of one link, and
//! copied by descriptor within bounds. Shared by both VMM drivers and their snapshots;
//! it uses nothing else of `vm` (so that `shared` and `snapshot` both may).

use std::path::Path;
use std::time::Instant;

use super::super::{SubstrateError, io_err};

/// `path` opened read-only without following a link (nor blocking on a FIFO), only if
/// it is a regular file of one link.
pub(crate) fn open_single(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)?;
    let m = file.metadata()?;
    if !m.is_file() || m.nlink() != 1 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is not a plain file of one link", path.display()),
        ));
    }
    Ok(file)
}

/// Copies a file of the VM uid's (in its directory, which it could change under the
/// copy; the VM's disk, or what Firecracker wrote) to `to`, a new file of the worker's
/// with mode 0600: from a descriptor of the plain file opened without following a
/// link, refused if longer than `most`, as a reflink where the filesystem makes one,
/// else sparsely (only its data extents: holes stay holes), at most the length it had
/// when opened (a file the VMM grows during the copy gets no further), and within
/// `deadline`.
pub(crate) fn copy_plain(
    disk: &Path,
    to: &Path,
    most: Option<u64>,
    deadline: Instant,
) -> Result<(), SubstrateError> {
    use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
    let from = open_single(disk).map_err(io_err(format!("open {}", disk.display())))?;
    let len = from.metadata().map_err(io_err("a VM file"))?.len();
    if let Some(most) = most.filter(|&m| len > m) {
        return Err(SubstrateError::InvalidSpec(format!(
            "{} is {len} bytes, over the {most} it can be",
            disk.display()
        )));
    }
    let _ = std::fs::remove_file(to);
    let out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(to)
        .map_err(io_err("a snapshot file"))?;
    // A reflink takes the whole file as it is at the call, which may be longer now:
    // cut back to the length checked.
    if rustix::fs::ioctl_ficlone(&out, &from).is_ok() {
        out.set_len(len).map_err(io_err("a snapshot file"))?;
        return out.sync_all().map_err(io_err("a snapshot file"));
    }
    out.set_len(len).map_err(io_err("a snapshot file"))?;
    let late = || {
        SubstrateError::Timeout(format!(
            "copying {} ({len} bytes) took too long",
            disk.display()
        ))
    };
    let mut pos = 0;
    let mut buf = vec![0u8; 1 << 20];
    while pos < len {
        let data = match rustix::fs::seek(&from, rustix::fs::SeekFrom::Data(pos)) {
            Ok(d) => d,
            // No data after `pos`: the rest is a hole.
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(SubstrateError::io("read a VM file", e.into())),
        };
        if data >= len {
            break;
        }
        let hole = rustix::fs::seek(&from, rustix::fs::SeekFrom::Hole(data))
            .unwrap_or(len)
            .min(len);
        let mut at = data;
        while at < hole {
            if Instant::now() > deadline {
                return Err(late());
            }
            let want = ((hole - at) as usize).min(buf.len());
            let n = from
                .read_at(&mut buf[..want], at)
                .map_err(io_err("read a VM file"))?;
            if n == 0 {
                // Shortened under the copy: the rest stays zero.
                break;
            }
            out.write_all_at(&buf[..n], at)
                .map_err(io_err("write a snapshot file"))?;
            at += n as u64;
        }
        pos = hole.max(at);
    }
    out.sync_all().map_err(io_err("a snapshot file"))
}

/// Makes `file` the worker's (its effective uid and gid), by descriptor.
pub(crate) fn own(file: &std::fs::File) -> std::io::Result<()> {
    std::os::unix::fs::fchown(
        file,
        Some(rustix::process::geteuid().as_raw()),
        Some(rustix::process::getegid().as_raw()),
    )
}
