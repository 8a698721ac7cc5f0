//! `space template build` end to end against a real `space up` (issue 16): a `--run`
//! step executed in a sandbox of a template and committed as a layer of a new one
//! (`POST /v1/sandboxes/{id}/commit`: its new file there, the file it removed hidden
//! by a whiteout), on a tiny image built here from busybox-static; and a Debian
//! template made with mmdebstrap, only where the test is given a mirror
//! (`SPACE_TEST_DEBIAN_MIRROR`: tests never reach the internet).

use std::path::Path;
use std::process::Output;

use space_image::rootfs::{self, ImageSpec, LayoutFormat};
use space_testkit::cluster as support;
use support::{Cluster, can_run_jails};

const BUSYBOX: &str = "/bin/busybox";

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}{}",
        text(&out),
        String::from_utf8_lossy(&out.stderr)
    );
    text(&out)
}

/// Why these tests cannot run here, if they cannot.
fn missing() -> Option<String> {
    if !can_run_jails() {
        return Some("needs root, namespaces and cgroups (see can_run_jails)".into());
    }
    if !space_worker::substrate::jail::template::is_static(Path::new(BUSYBOX)) {
        return Some(format!(
            "needs a statically linked busybox at {BUSYBOX} (Debian: busybox-static) as the test image's userland"
        ));
    }
    None
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_700_000_000);
    h.set_size(size);
    h
}

/// A root filesystem of busybox (as `mmdebstrap` would write one, `./` names), made
/// an OCI layout tar at `out` by the same code `space template build` uses.
fn busybox_image(out: &Path) {
    let busybox = std::fs::read(BUSYBOX).unwrap();
    let mut b = tar::Builder::new(Vec::new());
    for d in ["./", "./bin/", "./etc/", "./root/", "./tmp/"] {
        let mut h = header(tar::EntryType::Directory, 0o755, 0);
        b.append_data(&mut h, d, std::io::empty()).unwrap();
    }
    let mut h = header(tar::EntryType::Regular, 0o755, busybox.len() as u64);
    b.append_data(&mut h, "./bin/busybox", &busybox[..])
        .unwrap();
    for tool in ["sh", "cat", "ls", "rm", "echo", "test"] {
        let mut h = header(tar::EntryType::Symlink, 0o777, 0);
        b.append_link(&mut h, format!("./bin/{tool}"), "busybox")
            .unwrap();
    }
    for (path, body) in [
        ("./etc/passwd", &b"root:x:0:0:root:/root:/bin/sh\n"[..]),
        ("./etc/group", b"root:x:0:\n"),
        ("./etc/motd", b"the base's motd\n"),
    ] {
        let mut h = header(tar::EntryType::Regular, 0o644, body.len() as u64);
        b.append_data(&mut h, path, body).unwrap();
    }
    let rootfs = b.into_inner().unwrap();
    let mut spec = ImageSpec::debian(None);
    spec.defaults.env = vec!["PATH=/bin".into()];
    spec.defaults.cmd = Some(vec!["/bin/sh".into()]);
    rootfs::layout_from_rootfs(&rootfs[..], &spec, out, LayoutFormat::Tar).unwrap();
}

fn cluster() -> Cluster {
    let agent = space_testkit::static_agent();
    Cluster::start_with_env(&[("SPACE_AGENT", agent.to_str().unwrap())])
}

fn sh(c: &Cluster, id: &str, script: &str) -> String {
    ok(c.cli(&["exec", id, "--", "sh", "-c", script]))
}

fn templates(c: &Cluster) -> serde_json::Value {
    serde_json::from_str(&ok(c.cli(&["--json", "template", "ls"]))).unwrap()
}

fn layers_of(list: &serde_json::Value, name: &str, tag: &str) -> Option<u64> {
    list["templates"]
        .as_array()?
        .iter()
        .find(|t| t["name"] == name && t["tag"] == tag)
        .and_then(|t| t["layers"].as_u64())
}

#[test]
fn a_run_step_is_committed_as_a_layer_of_a_new_template() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let c = cluster();
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("busybox.tar");
    busybox_image(&image);
    ok(c.cli(&["template", "import", "bb:1", image.to_str().unwrap()]));
    let out = c.cli(&[
        "template",
        "build",
        "bb:2",
        "--from",
        "bb:1",
        "--run",
        "echo hi > /greeting; rm /etc/motd",
    ]);
    let progress = String::from_utf8_lossy(&out.stderr).into_owned();
    let digest = ok(out);
    assert!(digest.trim().starts_with("sha256:"), "{digest}{progress}");
    assert!(progress.contains("step 1/1"), "{progress}");
    // The base's layer and the step's; the step's own template is gone.
    let list = templates(&c);
    assert_eq!(layers_of(&list, "bb", "1"), Some(1), "{list}");
    assert_eq!(layers_of(&list, "bb", "2"), Some(2), "{list}");
    assert_eq!(
        list["templates"].as_array().map(Vec::len),
        Some(2),
        "{list}"
    );

    let id = c.create(&["--template", "bb:2"]);
    assert_eq!(
        sh(
            &c,
            &id,
            "cat /greeting; test -e /etc/motd || echo motd-gone; cat /etc/passwd"
        ),
        "hi\nmotd-gone\nroot:x:0:0:root:/root:/bin/sh\n"
    );
    // The base template is untouched by the step.
    let base = c.create(&["--template", "bb:1"]);
    assert_eq!(
        sh(&c, &base, "test -e /greeting || echo none; cat /etc/motd"),
        "none\nthe base's motd\n"
    );

    // A step that fails commits nothing and says why.
    let out = c.cli(&[
        "template",
        "build",
        "bb:3",
        "--from",
        "bb:1",
        "--run",
        "echo oops >&2; exit 3",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("exit 3") && err.contains("oops"), "{err}");
    assert_eq!(layers_of(&templates(&c), "bb", "3"), None);

    // A sandbox of the host-directories default has no layers to commit onto.
    let host = c.create(&[]);
    let (status, body) = c.http(
        "POST",
        &format!("{}/v1/sandboxes/{host}/commit", c.url),
        Some(&format!("Bearer {}", c.admin_key)),
        br#"{"name": "host:1"}"#,
    );
    assert_eq!(status, 409, "{}", String::from_utf8_lossy(&body));
}

#[test]
fn a_debian_template_is_built_with_mmdebstrap_and_a_run_step_adds_a_layer() {
    let Ok(mirror) = std::env::var("SPACE_TEST_DEBIAN_MIRROR") else {
        eprintln!(
            "SKIPPED: needs SPACE_TEST_DEBIAN_MIRROR, a Debian mirror URL this test may use \
             (e.g. a local mirror of bookworm: http://127.0.0.1:8000/debian), and \
             mmdebstrap; tests never reach the internet"
        );
        return;
    };
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let c = cluster();
    let out = c.cli(&[
        "template",
        "build",
        "deb:1",
        "--debian",
        "bookworm",
        "--mirror",
        &mirror,
        "--run",
        "echo built > /etc/built-by-step",
    ]);
    let progress = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out);
    assert!(progress.contains("mmdebstrap: "), "{progress}");
    assert_eq!(layers_of(&templates(&c), "deb", "1"), Some(2));
    let id = c.create(&["--template", "deb:1"]);
    let got = sh(
        &c,
        &id,
        "grep ^ID= /etc/os-release; cat /etc/built-by-step; test -x /usr/bin/apt && echo apt",
    );
    assert_eq!(got, "ID=debian\nbuilt\napt\n");
}
