//! A test CA and a server certificate for `127.0.0.1` and `localhost` signed by it,
//! made with the `openssl` command in a temporary directory (P-256 keys: quick).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A CA, and a server certificate and key it signed, as PEM files.
#[derive(Debug)]
pub struct TestCa {
    _dir: tempfile::TempDir,
    /// The CA certificate (what a client trusts).
    pub ca: PathBuf,
    /// The server certificate.
    pub cert: PathBuf,
    /// The server key.
    pub key: PathBuf,
}

/// Whether `openssl` can be run here.
pub fn have_openssl() -> bool {
    Command::new("openssl")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success())
}

impl TestCa {
    /// A new CA named `name`, with a certificate for `IP:127.0.0.1` and
    /// `DNS:localhost`.
    pub fn make(name: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = |f: &str| dir.path().join(f);
        std::fs::write(
            p("ext.cnf"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             extendedKeyUsage=serverAuth\n",
        )
        .expect("ext file");
        let s = |p: &Path| p.display().to_string();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let ca_subject = format!("/CN={name}");
        let runs: Vec<Vec<String>> = vec![
            [
                &["req", "-x509"][..],
                &ec,
                &["-days", "2", "-subj", &ca_subject],
            ]
            .concat()
            .into_iter()
            .map(str::to_owned)
            .chain(["-keyout", &s(&p("ca.key")), "-out", &s(&p("ca.pem"))].map(str::to_owned))
            .collect(),
            [&["req"][..], &ec, &["-subj", "/CN=localhost"]]
                .concat()
                .into_iter()
                .map(str::to_owned)
                .chain(["-keyout", &s(&p("key.pem")), "-out", &s(&p("req.pem"))].map(str::to_owned))
                .collect(),
            [
                "x509",
                "-req",
                "-in",
                &s(&p("req.pem")),
                "-CA",
                &s(&p("ca.pem")),
                "-CAkey",
                &s(&p("ca.key")),
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &s(&p("ext.cnf")),
                "-out",
                &s(&p("cert.pem")),
            ]
            .map(str::to_owned)
            .to_vec(),
        ];
        for args in runs {
            let out = Command::new("openssl")
                .args(&args)
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Self {
            ca: p("ca.pem"),
            cert: p("cert.pem"),
            key: p("key.pem"),
            _dir: dir,
        }
    }
}
