//! `space template pull` end to end (issue 16's registry pulls): the real `space`
//! binary pulls from a registry this test starts on 127.0.0.1 (space_testkit's,
//! requiring a bearer token that needs Basic credentials), through `--username` and
//! `--password-stdin`, into a platform the test starts; a sandbox of the pulled
//! template runs a command of its layer and sees its file. The pull's temporary
//! layout is gone afterwards, after a failed pull too.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use space_testkit::cluster::{Cluster, can_run_jails, space_bin};
use space_testkit::registry::{LayerBuilder, MediaTypes, Options, TestImage, TestRegistry};

const BUSYBOX: &str = "/bin/busybox";

fn missing() -> Option<String> {
    if !can_run_jails() {
        return Some("needs root, namespaces and cgroups (see can_run_jails)".into());
    }
    if !space_worker::substrate::jail::template::is_static(Path::new(BUSYBOX)) {
        return Some(format!(
            "needs a statically linked busybox at {BUSYBOX} (Debian: busybox-static) as the image's userland"
        ));
    }
    None
}

/// `space <args>` against `c` with `stdin`, its temporary files under `tmp`.
fn space(c: &Cluster, tmp: &Path, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(space_bin())
        .args(args)
        .env("SPACE_URL", &c.url)
        .env("SPACE_API_KEY", &c.admin_key)
        .env("TMPDIR", tmp)
        .env_remove("SPACE_REGISTRY_PASSWORD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the CLI");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin).expect("write stdin");
    drop(input);
    child.wait_with_output().expect("the CLI's output")
}

fn texts(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_template_pulled_from_a_registry_runs_a_sandbox_that_sees_its_layer() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let registry = TestRegistry::start(Options {
        token: true,
        basic: Some(("puller".into(), "pull-secret".into())),
        ..Options::default()
    });
    let busybox = std::fs::read(BUSYBOX).unwrap();
    let layer = LayerBuilder::new()
        .dir("bin", 0o755)
        .file("bin/busybox", &busybox, 0o755)
        .symlink("bin/sh", "busybox")
        .symlink("bin/cat", "busybox")
        .file("hello.txt", b"hello from the registry\n", 0o644)
        .finish();
    let image = TestImage::build(
        space_image::oci::host_architecture(),
        MediaTypes::Oci,
        vec![layer],
    );
    registry.push("team/pulled", "v1", &image);
    let agent = space_testkit::static_agent();
    let c = Cluster::start_with_env(&[("SPACE_AGENT", agent.to_str().unwrap())]);
    let tmp = tempfile::tempdir().unwrap();
    let reference = format!("{}/team/pulled:v1", registry.address());

    let pull = [
        "--json",
        "template",
        "pull",
        reference.as_str(),
        "--plain-http",
        "--username",
        "puller",
        "--password-stdin",
    ];
    let out = space(&c, tmp.path(), &pull, b"pull-secret\n");
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let view: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (&view["name"], &view["tag"]),
        (&"pulled".into(), &"v1".into()),
        "{view}"
    );
    assert!(
        view["digest"]
            .as_str()
            .is_some_and(|d| d.starts_with("sha256:"))
    );
    assert!(
        stderr.contains(&format!("manifest {}", image.manifest.digest)),
        "{stderr}"
    );
    assert!(stderr.contains("layer 1/1"), "{stderr}");
    // The credentials went to the token endpoint only, as Basic auth.
    assert!(registry.requests().iter().any(|r| {
        r.path.starts_with("/token?")
            && r.authorization
                .as_deref()
                .is_some_and(|a| a.starts_with("Basic "))
    }));
    // The pulled layout is gone.
    assert_eq!(entries(tmp.path()), Vec::<String>::new());

    let ls = texts(&c.cli(&["template", "ls"])).0;
    assert!(ls.contains("pulled:v1"), "{ls}");
    let id = c.create(&["--template", "pulled:v1"]);
    let out = c.cli(&["exec", &id, "--", "cat", "/hello.txt"]);
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(stdout, "hello from the registry\n");

    // A failed pull (a wrong password) leaves nothing behind either.
    let out = space(&c, tmp.path(), &pull, b"wrong\n");
    let (_, stderr) = texts(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("authentication"), "{stderr}");
    assert_eq!(entries(tmp.path()), Vec::<String>::new());
}

#[test]
fn a_pull_of_a_non_loopback_registry_over_plain_http_is_refused_by_the_cli() {
    // Refused before the platform is even asked (nothing listens at its URL).
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(space_bin())
        .args(["template", "pull", "203.0.113.7:5000/r:1", "--plain-http"])
        .env("SPACE_URL", "http://127.0.0.1:9")
        .env("SPACE_API_KEY", "unused")
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    let (_, stderr) = texts(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("only to a loopback address"), "{stderr}");
    assert_eq!(entries(tmp.path()), Vec::<String>::new());
}
