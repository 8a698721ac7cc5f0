//! Package managers in a sandbox with egress, against repositories on test hosts
//! reached by name: pip and npm in a sandbox of the default template (the host's
//! `/usr`), apt in a sandbox of a Debian template made from the host's own packages
//! (`space_testkit::debian_image`: no mirror is contacted) against a flat repository
//! of a package built here (`space_testkit::apt_repo`). A repository on a host the
//! policy does not allow is refused, and the refusal is in the sandbox's events.

use std::time::Instant;

use space_testkit::apt_repo::{self, DebSpec};
use space_testkit::cluster::Cluster;
use space_testkit::debian_image;

use super::dns::DnsServer;
use super::net::{TestCa, TestHost};
use super::probes::{refused_event, run, sh};
use super::{can_run, create, egress, upload};

/// Builds, in `dir`, a PEP 503 index (`simple/tinypkg/`) with a wheel of `tinypkg`
/// and an npm registry document (`tinynpm`) with its tarball, both naming
/// `http(s)://pkgs.test/`.
const MAKE_PACKAGES: &str = r#"
import base64, hashlib, io, json, os, sys, tarfile, zipfile
root = sys.argv[1]
def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (name, digest, len(data))
files = {
    "tinypkg/__init__.py": b"VALUE = 'from the test index'\n",
    "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
    "tinypkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: space-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = "\n".join(record_line(n, d) for n, d in files.items()) + "\ntinypkg-1.0.dist-info/RECORD,,\n"
wheel = "tinypkg-1.0-py3-none-any.whl"
os.makedirs(os.path.join(root, "simple", "tinypkg"))
os.makedirs(os.path.join(root, "packages"))
with zipfile.ZipFile(os.path.join(root, "packages", wheel), "w") as z:
    for n, d in files.items():
        z.writestr(n, d)
    z.writestr("tinypkg-1.0.dist-info/RECORD", record)
with open(os.path.join(root, "simple", "tinypkg", "index.html"), "w") as f:
    f.write('<html><body><a href="../../packages/%s">%s</a></body></html>\n' % (wheel, wheel))
with open(os.path.join(root, "simple", "index.html"), "w") as f:
    f.write('<html><body><a href="tinypkg/">tinypkg</a></body></html>\n')
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w:gz") as t:
    for n, d in {
        "package/package.json": json.dumps({"name": "tinynpm", "version": "1.0.0", "main": "index.js"}).encode(),
        "package/index.js": b"module.exports = 'from the test registry';\n",
    }.items():
        info = tarfile.TarInfo(n)
        info.size = len(d)
        t.addfile(info, io.BytesIO(d))
tgz = buf.getvalue()
os.makedirs(os.path.join(root, "tarballs"))
with open(os.path.join(root, "tarballs", "tinynpm-1.0.0.tgz"), "wb") as f:
    f.write(tgz)
doc = {"name": "tinynpm", "dist-tags": {"latest": "1.0.0"}, "versions": {"1.0.0": {
    "name": "tinynpm", "version": "1.0.0", "main": "index.js",
    "dist": {"tarball": "http://pkgs.test/tarballs/tinynpm-1.0.0.tgz",
             "shasum": hashlib.sha1(tgz).hexdigest()}}}}
with open(os.path.join(root, "tinynpm"), "w") as f:
    json.dump(doc, f)
"#;

#[test]
fn pip_and_npm_install_from_an_allowed_host_by_name_and_nothing_else() {
    if !can_run() {
        return;
    }
    let (pip, npm) = (
        std::path::Path::new("/usr/bin/python3").exists(),
        std::path::Path::new("/usr/bin/npm").exists(),
    );
    if !pip || !npm {
        eprintln!(
            "SKIPPED: needs the host's /usr/bin/python3 (with venv and pip) and /usr/bin/npm, which sandboxes of the default template run"
        );
        return;
    }
    let test = 11;
    let files = tempfile::tempdir().expect("tempdir");
    let made = std::process::Command::new("python3")
        .args(["-c", MAKE_PACKAGES])
        .arg(files.path())
        .output()
        .expect("python3");
    assert!(made.status.success(), "make the packages: {made:?}");
    let ca = TestCa::make("pkgs.test");
    let tls = Some((ca.cert.as_path(), ca.key.as_path()));
    let pkgs = TestHost::serving(test, 0, "pkgs", tls, Some(files.path()));
    let other = TestHost::start(test, 1, "other", None);
    let dns = DnsServer::start(&[("pkgs.test", pkgs.addr), ("other.test", other.addr)]);
    let slot = (200 + 2 * u32::from(test)).to_string();
    let upstream = dns.addr.to_string();
    let c = Cluster::start_with_env(&[
        ("SPACE_NO_EGRESS", "0"),
        ("SPACE_EGRESS_SLOT", &slot),
        ("SPACE_EGRESS_DNS", &upstream),
    ]);
    // The name only: every connection goes through the proxy, which dials pkgs.test.
    let id = create(&c, "w1", Some(egress(&["pkgs.test"], &[])));
    upload(
        &c,
        &id,
        "/root/ca.pem",
        &std::fs::read(&ca.ca).expect("the CA"),
    );

    // pip over HTTPS (the SNI path), in a venv: the default template's system Python
    // is externally managed (PEP 668), as on the host.
    let out = sh(
        &c,
        &id,
        "python3 -m venv /root/venv && /root/venv/bin/pip install --disable-pip-version-check \
         --no-cache-dir --cert /root/ca.pem --index-url https://pkgs.test/simple/ tinypkg \
         >/root/pip.log 2>&1 || { cat /root/pip.log; exit 1; }; \
         /root/venv/bin/python -c 'import tinypkg; print(tinypkg.VALUE)'",
    );
    assert_eq!(out.trim(), "from the test index");

    // npm over HTTP (the Host path).
    let out = sh(
        &c,
        &id,
        "mkdir -p /root/proj && cd /root/proj && npm install --no-audit --no-fund \
         --registry http://pkgs.test/ tinynpm >/root/npm.log 2>&1 || { cat /root/npm.log; exit 1; }; \
         node -e 'console.log(require(\"tinynpm\"))'",
    );
    assert_eq!(out.trim(), "from the test registry");

    // Another index is refused by name, though it serves the same path.
    let (code, out, err) = run(
        &c,
        &id,
        "/root/venv/bin/pip download --disable-pip-version-check --no-cache-dir --retries 0 \
         --timeout 5 --cert /root/ca.pem --index-url https://other.test/simple/ tinypkg -d /tmp/x",
    );
    assert_ne!(code, 0, "pip reached other.test: {out}{err}");
    refused_event(&c, &id, "dns", "other.test", "allow list");
}

/// What `space-hello` prints.
const HELLO: &str = "hello from the test repository";

/// The flat repository of test hosts `pkgs` and `other`: `space-hello`, whose
/// `postinst` records which account configured it.
fn hello_repository(dir: &std::path::Path) {
    let script = format!("#!/bin/sh\necho '{HELLO}'\n");
    let postinst = "#!/bin/sh\nset -e\nif [ \"$1\" = configure ]; then\n\
                    \x20 mkdir -p /var/lib/space-hello\n\
                    \x20 id -un > /var/lib/space-hello/configured-by\nfi\n";
    apt_repo::build_deb(
        &DebSpec {
            name: "space-hello",
            version: "1.0",
            description: "prints a greeting from the test repository",
            files: &[("/usr/bin/space-hello", script.as_bytes(), 0o755)],
            postinst: Some(postinst),
        },
        dir,
    )
    .expect("build space-hello");
    apt_repo::write_flat_index(dir).expect("the repository's index");
}

/// `apt-get args` as root in the sandbox, non-interactive: exit code and output
/// (stdout and stderr together).
fn apt_get(c: &Cluster, id: &str, args: &str) -> (i32, String) {
    let (code, out, err) = run(
        c,
        id,
        &format!("DEBIAN_FRONTEND=noninteractive apt-get -q {args} 2>&1"),
    );
    (code, format!("{out}{err}"))
}

/// Whether apt's output `out` says it failed to fetch a file of `host` with `why`.
fn failed(out: &str, host: &str, why: &str) -> bool {
    let prefix = format!("E: Failed to fetch http://{host}/");
    out.lines()
        .any(|l| l.starts_with(&prefix) && l.contains(why))
}

#[test]
fn apt_installs_a_package_from_an_allowed_host_by_name_and_nothing_else() {
    if !can_run() {
        return;
    }
    if let Some(what) = debian_image::missing() {
        eprintln!(
            "SKIPPED: needs {what}: the test's Debian template is made of this host's installed packages"
        );
        return;
    }
    let started = Instant::now();
    let image = debian_image::with_apt();
    eprintln!(
        "the Debian image: {} packages, {} entries, {} MB of files, {}",
        image.packages.len(),
        image.entries,
        image.bytes >> 20,
        match image.built_in {
            Some(t) => format!("built in {t:.1?}"),
            None => "from the cache".into(),
        }
    );
    let test = 14;
    let repo = tempfile::tempdir().expect("tempdir");
    hello_repository(repo.path());
    // Both serve the same repository: only the policy tells them apart.
    let pkgs = TestHost::repository(test, 0, "pkgs", repo.path());
    let other = TestHost::repository(test, 1, "other", repo.path());
    let dns = DnsServer::start(&[("pkgs.test", pkgs.addr), ("other.test", other.addr)]);
    let slot = (200 + 2 * u32::from(test)).to_string();
    let upstream = dns.addr.to_string();
    let agent = space_testkit::static_agent();
    let c = Cluster::start_with_env(&[
        ("SPACE_NO_EGRESS", "0"),
        ("SPACE_EGRESS_SLOT", &slot),
        ("SPACE_EGRESS_DNS", &upstream),
        ("SPACE_AGENT", agent.to_str().expect("a UTF-8 path")),
    ]);
    let imported = Instant::now();
    let out = c.cli(&[
        "template",
        "import",
        "debian-apt:1",
        image.layout.to_str().expect("a UTF-8 path"),
    ]);
    assert!(
        out.status.success(),
        "template import: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("template import: {:.1?}", imported.elapsed());
    let id = c.create(&[
        "--template",
        "debian-apt:1",
        "--net",
        "egress",
        "--allow",
        "pkgs.test",
    ]);
    // The image's system, not the host's (which has python3).
    assert_eq!(
        sh(
            &c,
            &id,
            "id -un; test -e /usr/bin/python3 || echo no-python3; \
             test -e /usr/bin/space-hello || echo no-hello"
        ),
        "root\nno-python3\nno-hello\n"
    );
    upload(
        &c,
        &id,
        "/etc/apt/sources.list.d/pkgs.list",
        b"deb [trusted=yes] http://pkgs.test/ ./\n",
    );

    // No `-o APT::Sandbox::User=root` is needed: apt's download methods drop to
    // `_apt` (setgroups, setresgid, setresuid; seen as uid 42, group 65534 in the
    // sandbox's /proc while `http` ran), which works because the sandbox's root keeps
    // CAP_SETUID and CAP_SETGID inside a user namespace that maps a whole range of
    // 65,536 ids (`_apt` included), and seccomp allows those calls. A worker with
    // `--no-userns` keeps its sandboxes' root no capability: there the drop fails
    // ("E: setgroups 65534 failed", seen) and so does apt's chown of its partial
    // directories, which the option would not mend. Had apt downloaded as root, it
    // would have warned ("unsandboxed"), which the output is checked for.
    let (code, out) = apt_get(&c, &id, "update");
    assert_eq!(code, 0, "apt-get update: {out}");
    assert!(out.contains("http://pkgs.test ./"), "{out}");
    for bad in ["unsandboxed", "W:", "E:"] {
        assert!(!out.contains(bad), "apt-get update said {bad:?}: {out}");
    }
    let (code, out) = apt_get(&c, &id, "install -y space-hello");
    assert_eq!(code, 0, "apt-get install: {out}");
    assert!(out.contains("Setting up space-hello (1.0)"), "{out}");
    assert_eq!(sh(&c, &id, "space-hello").trim(), HELLO);
    // dpkg ran the maintainer script, as root, and records the package installed.
    assert_eq!(
        sh(
            &c,
            &id,
            "cat /var/lib/space-hello/configured-by; dpkg-query -W -f '${Status}' space-hello"
        ),
        "root\ninstall ok installed"
    );

    // A second repository on a host the policy does not allow: its name is not
    // resolved, so apt-get update fails for it (and only for it).
    upload(
        &c,
        &id,
        "/etc/apt/sources.list.d/other.list",
        b"deb [trusted=yes] http://other.test/ ./\n",
    );
    // `--error-on=any`: a source that fails fails the update (by default apt warns);
    // no retries (apt's three take seconds).
    let refused_update = "update --error-on=any -o Acquire::Retries=0";
    let (code, out) = apt_get(&c, &id, refused_update);
    assert_ne!(code, 0, "apt-get update reached other.test: {out}");
    assert!(
        failed(&out, "other.test", "resolving 'other.test'"),
        "{out}"
    );
    assert!(
        out.contains("http://pkgs.test ./ Release")
            && !out
                .lines()
                .any(|l| l.starts_with("Err:") && l.contains("pkgs.test")),
        "pkgs.test was not read: {out}"
    );
    refused_event(&c, &id, "dns", "other.test", "allow list");
    // Told its address by /etc/hosts, apt connects, and the platform's proxy refuses
    // the request by its Host (403 is never what the test host itself answers).
    sh(
        &c,
        &id,
        &format!("echo '{} other.test' >> /etc/hosts", other.addr),
    );
    let (code, out) = apt_get(&c, &id, refused_update);
    assert_ne!(code, 0, "apt-get update reached other.test: {out}");
    assert!(
        failed(&out, "other.test", "403  Forbidden"),
        "not refused by the proxy: {out}"
    );
    refused_event(&c, &id, "http", "other.test", "name not in the allow list");
    eprintln!("the apt test took {:.1?}", started.elapsed());
}
