//! The uncompressed kernel (`vmlinux`, an ELF) inside a distribution's `vmlinuz`
//! (a bzImage): what a VMM that boots only ELF kernels needs (Firecracker up to
//! 1.16 on x86_64). The bzImage's payload is found by its compressor's magic and
//! decompressed by that compressor's own tool, its output bounded and checked to be a
//! 64-bit x86 ELF before it is kept.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Largest kernel accepted (a distribution's is 30–70 MiB uncompressed).
const MAX_VMLINUX: u64 = 512 << 20;

/// Payload compressors of a bzImage: magic, and the tool that decompresses the rest.
const COMPRESSORS: &[(&[u8], &str)] = &[
    (&[0x02, 0x21, 0x4c, 0x18], "lz4"),
    (&[0x28, 0xb5, 0x2f, 0xfd], "zstd"),
    (&[0xfd, b'7', b'z', b'X', b'Z', 0x00], "xz"),
    (&[0x1f, 0x8b, 0x08], "gzip"),
];

/// `<dir>/vmlinux`, made from `vmlinuz` the first time.
pub fn vmlinux(vmlinuz: &Path, dir: &Path) -> Result<PathBuf, String> {
    let out = dir.join("vmlinux");
    if std::fs::read(&out).is_ok_and(|b| is_x86_64_elf(&b)) {
        return Ok(out);
    }
    let image = std::fs::read(vmlinuz).map_err(|e| format!("{}: {e}", vmlinuz.display()))?;
    let mut tried = Vec::new();
    for (magic, tool) in COMPRESSORS {
        let mut from = 0;
        while let Some(at) = find(&image[from..], magic).map(|i| i + from) {
            from = at + 1;
            match decompress(tool, &image[at..]) {
                Ok(elf) if is_x86_64_elf(&elf) => {
                    // Per call (two workers sharing a kernel directory may make it at
                    // once), durable before it is renamed into place.
                    static MADE: std::sync::atomic::AtomicU64 =
                        std::sync::atomic::AtomicU64::new(0);
                    let tmp = dir.join(format!(
                        ".vmlinux.{}.{}.tmp",
                        std::process::id(),
                        MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                    ));
                    let written = std::fs::File::create(&tmp)
                        .and_then(|mut f| f.write_all(&elf).and_then(|()| f.sync_all()))
                        .and_then(|()| std::fs::rename(&tmp, &out));
                    if let Err(e) = written {
                        let _ = std::fs::remove_file(&tmp);
                        return Err(format!("{}: {e}", out.display()));
                    }
                    return Ok(out);
                }
                Ok(_) => tried.push(format!("{tool} at {at}: not an x86-64 ELF")),
                Err(e) => tried.push(format!("{tool} at {at}: {e}")),
            }
            if tried.len() > 16 {
                break;
            }
        }
    }
    Err(format!(
        "no ELF kernel found in {} ({})",
        vmlinuz.display(),
        if tried.is_empty() {
            "no known compressor's magic".to_owned()
        } else {
            tried.join("; ")
        }
    ))
}

/// `tool -dc` of `data`: what it wrote (at most [`MAX_VMLINUX`] bytes), even when it
/// complains of trailing bytes (the bzImage's own after the payload).
fn decompress(tool: &str, data: &[u8]) -> Result<Vec<u8>, String> {
    let mut child = Command::new(tool)
        .args(["-dc"])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("run {tool}: {e}"))?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let data = data.to_vec();
    // Fed from a thread: the tool's output must be read while it is written.
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&data);
    });
    let mut out = Vec::new();
    let read = child
        .stdout
        .take()
        .ok_or("no stdout")?
        .take(MAX_VMLINUX + 1)
        .read_to_end(&mut out);
    let _ = child.kill();
    let _ = child.wait();
    let _ = feeder.join();
    read.map_err(|e| format!("{tool}: {e}"))?;
    if out.len() as u64 > MAX_VMLINUX {
        return Err(format!("over {MAX_VMLINUX} bytes"));
    }
    Ok(out)
}

/// An ELF header of a 64-bit little-endian x86-64 executable.
fn is_x86_64_elf(b: &[u8]) -> bool {
    b.len() > 64
        && b.starts_with(b"\x7fELF")
        && b[4] == 2
        && b[5] == 1
        && u16::from_le_bytes([b[18], b[19]]) == 62
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_64_bit_x86_elf_passes() {
        let mut elf = vec![0u8; 128];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[18] = 62;
        assert!(is_x86_64_elf(&elf));
        elf[18] = 183; // aarch64
        assert!(!is_x86_64_elf(&elf));
        assert!(!is_x86_64_elf(b"\x7fELF"));
    }

    #[test]
    fn a_bzimage_without_a_payload_is_refused_saying_so() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("vmlinuz");
        std::fs::write(&fake, vec![0x55u8; 4096]).unwrap();
        let e = vmlinux(&fake, dir.path()).unwrap_err();
        assert!(e.contains("no known compressor"), "{e}");
        assert!(!dir.path().join("vmlinux").exists());
    }
}
