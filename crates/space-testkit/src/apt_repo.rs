//! A flat apt repository (`deb [trusted=yes] http://HOST/ ./`) of packages built here
//! with `dpkg-deb --build`: a `Packages` index and an unsigned `Release` that lists it
//! by SHA-256, written here (dpkg-dev's `dpkg-scanpackages` is not on a fresh Debian;
//! `dpkg-deb` is part of dpkg).

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest as _, Sha256};

/// A package to build: `Architecture: all`, root's files.
#[derive(Debug, Clone, Copy)]
pub struct DebSpec<'a> {
    pub name: &'a str,
    pub version: &'a str,
    /// Its one-line description.
    pub description: &'a str,
    /// Its files: absolute path, contents, mode.
    pub files: &'a [(&'a str, &'a [u8], u32)],
    /// Its `postinst` (a shell script), if it has one.
    pub postinst: Option<&'a str>,
}

/// Builds `spec` as `dir/<name>_<version>_all.deb`; its path.
pub fn build_deb(spec: &DebSpec<'_>, dir: &Path) -> io::Result<PathBuf> {
    let staging = tempfile::tempdir()?;
    let root = staging.path().join("root");
    let control = root.join("DEBIAN");
    fs::create_dir_all(&control)?;
    fs::write(
        control.join("control"),
        format!(
            "Package: {}\nVersion: {}\nArchitecture: all\n\
             Maintainer: SPACE tests <tests@space.invalid>\nDescription: {}\n",
            spec.name, spec.version, spec.description
        ),
    )?;
    if let Some(script) = spec.postinst {
        let p = control.join("postinst");
        fs::write(&p, script)?;
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755))?;
    }
    for (path, body, mode) in spec.files {
        let p = root.join(path.trim_start_matches('/'));
        fs::create_dir_all(p.parent().unwrap_or(&root))?;
        fs::write(&p, body)?;
        fs::set_permissions(&p, fs::Permissions::from_mode(*mode))?;
    }
    let deb = dir.join(format!("{}_{}_all.deb", spec.name, spec.version));
    let out = Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zgzip", "--build"])
        .arg(&root)
        .arg(&deb)
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "dpkg-deb --build {}: {}",
            spec.name,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(deb)
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// Writes `dir/Packages` (every `.deb` of `dir`, its control fields as `dpkg-deb -f`
/// gives them, then `Filename`, `Size`, `SHA256`) and `dir/Release`, which lists it.
pub fn write_flat_index(dir: &Path) -> io::Result<()> {
    let mut debs: Vec<PathBuf> = fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    debs.sort();
    let mut packages = String::new();
    for deb in &debs {
        let out = Command::new("dpkg-deb").arg("-f").arg(deb).output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "dpkg-deb -f {}: {}",
                deb.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let bytes = fs::read(deb)?;
        let name = deb.file_name().unwrap_or_default().to_string_lossy();
        let _ = write!(
            packages,
            "{}\nFilename: ./{name}\nSize: {}\nSHA256: {}\n\n",
            String::from_utf8_lossy(&out.stdout).trim_end(),
            bytes.len(),
            sha256_hex(&bytes)
        );
    }
    fs::write(dir.join("Packages"), &packages)?;
    // A date in the past: apt refuses a Release "not valid yet".
    let release = format!(
        "Origin: space-tests\nLabel: space-tests\nDate: Sat, 01 Jan 2000 00:00:00 UTC\n\
         SHA256:\n {} {} Packages\n",
        sha256_hex(packages.as_bytes()),
        packages.len()
    );
    fs::write(dir.join("Release"), release)
}
