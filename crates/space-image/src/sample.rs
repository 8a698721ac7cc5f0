//! A small sample image, for tests and benchmarks that need a real one without a
//! registry: a `docker save` archive of two layers whose userland is a statically
//! linked busybox (Debian: `busybox-static`), so it runs with nothing else of a
//! distribution.
//!
//! - the base layer: `/bin/busybox` and links to it (`sh`, `cat`, `ls`, `id`, `pwd`,
//!   `stat`, `test`, `echo`, `du`, `touch`, `true`, `false`, `env`, `grep`, `head`,
//!   `rm`, `mkdir`, `sleep`), `/etc/passwd` (`root`, `app` = 1234),
//!   `/etc/group`, `/etc/os-release` (`ID=spacetest`, `VERSION_ID=1`), `/etc/motd`,
//!   `/home/app` (owned by 1234, 0750), `/dir/old`;
//! - the top layer: `/etc/os-release` with `VERSION_ID=2`, a whiteout of
//!   `/etc/motd`, `/dir` made opaque with `/dir/new` in it;
//! - the config: `Env` `PATH=/bin` and `GREETING=hello from the image`,
//!   `WorkingDir` `/home/app`, `User` `app`, `Cmd` `/bin/sh`; tagged `spacetest:1`.

use std::io::{self, Write};
use std::path::Path;

use sha2::{Digest as _, Sha256};

fn sha256(bytes: &[u8]) -> String {
    let hex: String = Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

type Layer = tar::Builder<Vec<u8>>;

/// One layer as a tar: entries appended by `fill`.
fn layer(fill: impl FnOnce(&mut Layer) -> io::Result<()>) -> io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    fill(&mut b)?;
    b.into_inner()
}

/// A header with an owner, a mode and a fixed time (the archive is reproducible).
fn header(kind: tar::EntryType, size: u64, mode: u32, owner: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(owner);
    h.set_gid(owner);
    h.set_mtime(1_700_000_000);
    h
}

fn file(b: &mut Layer, path: &str, body: &[u8], mode: u32, owner: u64) -> io::Result<()> {
    let mut h = header(tar::EntryType::Regular, body.len() as u64, mode, owner);
    b.append_data(&mut h, path, body)
}

fn dir(b: &mut Layer, path: &str, mode: u32, owner: u64) -> io::Result<()> {
    let mut h = header(tar::EntryType::Directory, 0, mode, owner);
    b.append_data(&mut h, path, io::empty())
}

fn link(b: &mut Layer, path: &str, target: &str) -> io::Result<()> {
    let mut h = header(tar::EntryType::Symlink, 0, 0o777, 0);
    b.append_link(&mut h, path, target)
}

/// Writes the sample image (see the module) as a `docker save` archive at `out`,
/// with the busybox at `busybox` as its userland.
pub fn write_docker_save(out: &Path, busybox: &Path) -> io::Result<()> {
    let busybox = std::fs::read(busybox)?;
    let base = layer(|b| {
        dir(b, "bin", 0o755, 0)?;
        file(b, "bin/busybox", &busybox, 0o755, 0)?;
        for tool in [
            "sh", "cat", "ls", "id", "pwd", "stat", "test", "echo", "du", "touch", "true", "false",
            "env", "grep", "head", "rm", "mkdir", "sleep",
        ] {
            link(b, &format!("bin/{tool}"), "busybox")?;
        }
        dir(b, "etc", 0o755, 0)?;
        file(
            b,
            "etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\napp:x:1234:1234:app:/home/app:/bin/sh\n",
            0o644,
            0,
        )?;
        file(b, "etc/group", b"root:x:0:\napp:x:1234:\n", 0o644, 0)?;
        file(
            b,
            "etc/os-release",
            b"ID=spacetest\nVERSION_ID=1\n",
            0o644,
            0,
        )?;
        file(b, "etc/motd", b"the base layer's\n", 0o644, 0)?;
        dir(b, "home", 0o755, 0)?;
        dir(b, "home/app", 0o750, 1234)?;
        dir(b, "dir", 0o755, 0)?;
        file(b, "dir/old", b"old\n", 0o644, 0)
    })?;
    let top = layer(|b| {
        dir(b, "etc", 0o755, 0)?;
        file(
            b,
            "etc/os-release",
            b"ID=spacetest\nVERSION_ID=2\n",
            0o644,
            0,
        )?;
        file(b, "etc/.wh.motd", b"", 0o644, 0)?;
        dir(b, "dir", 0o755, 0)?;
        file(b, "dir/.wh..wh..opq", b"", 0o644, 0)?;
        file(b, "dir/new", b"new\n", 0o644, 0)
    })?;
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": ["PATH=/bin", "GREETING=hello from the image"],
            "WorkingDir": "/home/app",
            "User": "app",
            "Cmd": ["/bin/sh"],
        },
        "rootfs": {"type": "layers", "diff_ids": [sha256(&base), sha256(&top)]},
    })
    .to_string();
    let config_name = format!("{}.json", &sha256(config.as_bytes())[7..]);
    let manifest = serde_json::json!([{
        "Config": config_name,
        "RepoTags": ["spacetest:1"],
        "Layers": ["base/layer.tar", "top/layer.tar"],
    }])
    .to_string();
    let mut archive = tar::Builder::new(std::fs::File::create(out)?);
    for (name, body) in [
        ("manifest.json", manifest.as_bytes()),
        (config_name.as_str(), config.as_bytes()),
        ("base/layer.tar", base.as_slice()),
        ("top/layer.tar", top.as_slice()),
    ] {
        let mut h = header(tar::EntryType::Regular, body.len() as u64, 0o644, 0);
        archive.append_data(&mut h, name, body)?;
    }
    archive.into_inner()?.flush()
}
