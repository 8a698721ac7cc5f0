//! Templates end to end against a real `space up` (issue 16): the sample image of
//! `space_image::sample` as a `docker save` archive (busybox-static as its userland,
//! a whiteout and an opaque directory in its upper layer, an `Env`, a `WorkingDir`, a
//! `User`) imported through
//! `space template import`, sandboxes of it that see its files and defaults and none
//! of the host's, two sandboxes sharing its layers (measured), a migration and a
//! snapshot's resume onto a worker that did not have it, `rm` refused while in use,
//! and a template removed at the control plane gone from the worker's disk at its
//! next sync.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

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

/// A cluster whose workers run the static agent, with the test image imported as
/// `spacetest:1`; the archive's directory is kept alive with it.
fn cluster_with_image() -> Option<(Cluster, tempfile::TempDir)> {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return None;
    }
    let agent = space_testkit::static_agent();
    let c = Cluster::start_with_env(&[("SPACE_AGENT", agent.to_str().unwrap())]);
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("image.tar");
    space_image::sample::write_docker_save(&archive, Path::new(BUSYBOX)).unwrap();
    let out = ok(c.cli(&[
        "template",
        "import",
        "spacetest:1",
        archive.to_str().unwrap(),
    ]));
    assert!(out.contains("sha256:"), "{out}");
    Some((c, dir))
}

fn sh(c: &Cluster, id: &str, script: &str) -> String {
    ok(c.cli(&["exec", id, "--", "sh", "-c", script]))
}

fn worker_of(c: &Cluster, id: &str) -> String {
    c.sandbox(id)["execution"]["worker"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Bytes under `dir` (apparent sizes of regular files), `0` when absent.
fn bytes_under(dir: &Path) -> u64 {
    fn walk(p: &Path) -> u64 {
        let Ok(meta) = std::fs::symlink_metadata(p) else {
            return 0;
        };
        if meta.is_dir() {
            std::fs::read_dir(p)
                .map(|rd| rd.flatten().map(|e| walk(&e.path())).sum())
                .unwrap_or(0)
        } else if meta.is_file() {
            meta.len()
        } else {
            0
        }
    }
    walk(dir)
}

fn images_dir(c: &Cluster, worker: &str) -> PathBuf {
    c.worker_dir(worker).join("images")
}

#[test]
fn a_sandbox_of_an_imported_image_sees_its_layers_and_defaults_and_nothing_of_the_host() {
    let Some((c, _dir)) = cluster_with_image() else {
        return;
    };
    let ls = ok(c.cli(&["template", "ls"]));
    assert!(ls.contains("spacetest:1"), "{ls}");
    let id = c.create(&["--template", "spacetest:1"]);
    let got = c.sandbox(&id);
    let template = got["template"].as_str().unwrap();
    assert!(
        template.starts_with("spacetest:1@sha256:"),
        "the record pins the digest: {got}"
    );
    // The top layer's file, the whiteout and the opaque directory.
    assert_eq!(
        sh(
            &c,
            &id,
            "cat /etc/os-release; test -e /etc/motd || echo no-motd; ls /dir"
        ),
        "ID=spacetest\nVERSION_ID=2\nno-motd\nnew\n"
    );
    // The image's defaults: its user, working directory and environment.
    assert_eq!(
        sh(&c, &id, "id -u; pwd; echo $GREETING"),
        "1234\n/home/app\nhello from the image\n"
    );
    // Root on request, and the image's owners are the sandbox's ids.
    let out = ok(c.cli(&[
        "exec",
        "--user",
        "0",
        &id,
        "--",
        "sh",
        "-c",
        "id -u; stat -c %u /home/app",
    ]));
    assert_eq!(out, "0\n1234\n");
    // Nothing of the host's system directories.
    assert_eq!(
        sh(
            &c,
            &id,
            "test -e /usr/bin/python3 || echo none; ls /usr 2>&1 | head -c 0"
        ),
        "none\n"
    );
}

#[test]
fn two_sandboxes_of_one_template_share_its_layers_on_disk() {
    let Some((c, _dir)) = cluster_with_image() else {
        return;
    };
    let first = c.create(&["--template", "spacetest:1"]);
    let worker = worker_of(&c, &first);
    let images = images_dir(&c, &worker);
    let layers_once = bytes_under(&images.join("layers"));
    // busybox alone is about a megabyte: the layers were unpacked here.
    assert!(layers_once > 500_000, "{layers_once} bytes of layers");
    // The second sandbox on the same worker: the template's layers are not copied.
    let second = c.create(&["--template", "spacetest:1", "--worker", &worker]);
    assert_eq!(worker_of(&c, &second), worker);
    assert_eq!(
        sh(&c, &second, "cat /etc/os-release"),
        "ID=spacetest\nVERSION_ID=2\n"
    );
    assert_eq!(bytes_under(&images.join("layers")), layers_once);
    // Each sandbox's own layer holds only what it wrote (the platform's /etc files).
    for id in [&first, &second] {
        let upper: u64 = std::fs::read_dir(c.worker_dir(&worker).join("sandboxes"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(id.as_str()))
            .map(|e| bytes_under(&e.path().join("upper")))
            .sum();
        assert!(
            upper < 64 * 1024,
            "{id}'s writable layer holds {upper} bytes: a copy of the template?"
        );
    }
}

#[test]
fn a_migration_to_a_worker_without_the_template_sends_it_first() {
    let Some((c, _dir)) = cluster_with_image() else {
        return;
    };
    let id = c.create(&["--template", "spacetest:1"]);
    sh(&c, &id, "echo kept > /home/app/note");
    let from = worker_of(&c, &id);
    let to = c
        .worker_urls()
        .into_iter()
        .map(|(w, _)| w)
        .find(|w| *w != from)
        .expect("a second worker");
    assert_eq!(bytes_under(&images_dir(&c, &to).join("layers")), 0);
    ok(c.cli(&["sandbox", "migrate", &id, "--worker", &to]));
    assert_eq!(worker_of(&c, &id), to);
    assert_eq!(
        sh(&c, &id, "cat /home/app/note /etc/os-release; id -u"),
        "kept\nID=spacetest\nVERSION_ID=2\n1234\n"
    );
    assert!(bytes_under(&images_dir(&c, &to).join("layers")) > 500_000);
}

#[test]
fn a_snapshot_of_a_templated_sandbox_resumes_on_a_worker_that_lacked_the_template() {
    let Some((c, _dir)) = cluster_with_image() else {
        return;
    };
    let id = c.create(&["--template", "spacetest:1"]);
    sh(&c, &id, "echo before > /home/app/note");
    let from = worker_of(&c, &id);
    let to = c
        .worker_urls()
        .into_iter()
        .map(|(w, _)| w)
        .find(|w| *w != from)
        .expect("a second worker");
    ok(c.cli(&["sandbox", "snapshot", &id]));
    ok(c.cli(&["sandbox", "resume", &id, "--worker", &to]));
    assert_eq!(worker_of(&c, &id), to);
    assert_eq!(sh(&c, &id, "cat /home/app/note; ls /dir"), "before\nnew\n");
}

#[test]
fn a_template_in_use_is_not_removed() {
    let Some((c, _dir)) = cluster_with_image() else {
        return;
    };
    let id = c.create(&["--template", "spacetest:1"]);
    let refused = c.cli(&["template", "rm", "spacetest:1"]);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("template_in_use"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert_eq!(sh(&c, &id, "cat /dir/new"), "new\n");
    ok(c.cli(&["sandbox", "rm", &id]));
    ok(c.cli(&["template", "rm", "spacetest:1"]));
    let ls = ok(c.cli(&["template", "ls"]));
    assert!(!ls.contains("spacetest:1"), "{ls}");
    // An unknown template is refused at create, and nothing starts.
    let out = c.cli(&["sandbox", "create", "--template", "spacetest:1"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown template"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_template_removed_at_the_control_plane_leaves_the_workers_disk_at_its_next_sync() {
    let Some((c, _dir)) = cluster_with_image() else {
        return;
    };
    let id = c.create(&["--template", "spacetest:1"]);
    let images = images_dir(&c, &worker_of(&c, &id));
    assert!(bytes_under(&images.join("layers")) > 500_000);
    ok(c.cli(&["sandbox", "rm", &id]));
    ok(c.cli(&["template", "rm", "spacetest:1"]));
    // The worker's periodic sync (every 15 s) carries the control plane's list of
    // templates, which no longer names it.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = bytes_under(&images.join("layers")) + bytes_under(&images.join("blobs"));
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} bytes of the removed template are still on the worker"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(
        std::fs::read_dir(images.join("templates/manifests"))
            .map(Iterator::count)
            .ok(),
        Some(0)
    );
}
