//! Accounts and files against a real `space up` (issue 16): exec and terminals as
//! the sandbox's `user` account, `setpriv` to it from the sandbox's root, uploads that
//! keep their mode and make their parents, directories in and out as tar streams, and
//! the hostile sides of those streams (an archive with `..` sent into a sandbox, and
//! a tar a sandbox serves that tries to make `space fs get -r` write outside its
//! target).

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::process::Output;

use space_client::{Client, Options, TerminalEvent};
use space_identity::SandboxId;
use space_testkit::cluster as support;
use support::{Cluster, can_run_jails, space_bin};

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

fn started() -> Option<(Cluster, String)> {
    if !can_run_jails() {
        return None;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    Some((c, id))
}

/// An exec through the edge's HTTP API: (status, JSON answer).
fn exec_json(c: &Cluster, id: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let (status, out) = c.http(
        "POST",
        &format!("{}/v1/sandboxes/{id}/exec", c.url),
        Some(&format!("Bearer {}", c.admin_key)),
        body.to_string().as_bytes(),
    );
    (status, serde_json::from_slice(&out).unwrap_or_default())
}

/// A `PUT` of `body` at `pq` through the edge: (status, body).
fn put(c: &Cluster, pq: &str, body: &[u8]) -> (u16, String) {
    let (status, out) = c.http(
        "PUT",
        &format!("{}{pq}", c.url),
        Some(&format!("Bearer {}", c.admin_key)),
        body,
    );
    (status, String::from_utf8_lossy(&out).into_owned())
}

#[test]
fn a_command_run_as_user_has_uid_1000_its_groups_and_its_home() {
    let Some((c, id)) = started() else { return };
    let out = ok(c.cli(&[
        "exec",
        "--user",
        "user",
        &id,
        "--",
        "sh",
        "-c",
        "id -u; id -g; echo HOME=$HOME USER=$USER LOGNAME=$LOGNAME; pwd; touch mine; stat -c %u mine",
    ]));
    assert_eq!(
        out,
        "1000\n1000\nHOME=/home/user USER=user LOGNAME=user\n/home/user\n1000\n"
    );
    // A uid works too, and root stays the default.
    assert_eq!(
        ok(c.cli(&["exec", "-u", "1000", &id, "--", "id", "-un"])),
        "user\n"
    );
    assert_eq!(ok(c.cli(&["exec", &id, "--", "id", "-u"])), "0\n");
}

#[test]
fn setpriv_from_the_sandboxs_root_reaches_the_user_account_and_cannot_come_back() {
    let Some((c, id)) = started() else { return };
    let script = "setpriv --reuid=user --regid=user --init-groups id";
    let (status, v) = exec_json(&c, &id, serde_json::json!({"cmd": ["sh", "-c", script]}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["exit_code"], 0, "{v}");
    let out = v["stdout"].as_str().unwrap();
    assert!(out.starts_with("uid=1000(user) gid=1000(user)"), "{v}");
    // The account holds no capability, and no_new_privs keeps it that way: it cannot
    // switch back to root.
    let back = "setpriv --reuid=user --regid=user --init-groups setpriv --reuid=0 id -u";
    let (_, v) = exec_json(&c, &id, serde_json::json!({"cmd": ["sh", "-c", back]}));
    assert_ne!(v["exit_code"], 0, "{v}");
    assert!(
        v["stderr"].as_str().unwrap().contains("not permitted"),
        "{v}"
    );
}

#[test]
fn an_unknown_user_is_refused_with_400_and_nothing_runs() {
    let Some((c, id)) = started() else { return };
    let (status, v) = exec_json(
        &c,
        &id,
        serde_json::json!({"cmd": ["touch", "/tmp/ran"], "user": "nobody-by-that-name"}),
    );
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"], "unknown_user", "{v}");
    let (status, _) = put(
        &c,
        &format!("/v1/sandboxes/{id}/files?path=/tmp/up&user=nobody-by-that-name"),
        b"x",
    );
    assert_eq!(status, 400);
    let out = ok(c.cli(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "ls /tmp/ran /tmp/up 2>&1; true",
    ]));
    assert!(out.matches("No such file").count() == 2, "{out}");
    let refused = c.cli(&["exec", "--user", "nobody-by-that-name", &id, "--", "true"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("unknown_user"));
}

#[test]
fn a_terminal_opened_as_user_runs_its_shell_as_uid_1000_in_its_home() {
    let Some((c, id)) = started() else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = Client::with_options(
        &c.url,
        &c.admin_key,
        Options {
            direct: false,
            ..Options::default()
        },
    );
    let sandbox: SandboxId = id.parse().unwrap();
    rt.block_on(async {
        let user = space_proto::api::User::Name("user".into());
        let mut term = client
            .terminal_as(&sandbox, 24, 80, Some(&user))
            .await
            .expect("terminal");
        term.send("echo \"as-$(id -u)-in-$(pwd)\"; exit 3\n")
            .await
            .unwrap();
        let (mut shown, mut exited) = (Vec::new(), None);
        let ended = tokio::time::timeout(std::time::Duration::from_secs(20), async {
            while let Some(event) = term.next().await {
                match event.expect("event") {
                    TerminalEvent::Output(b) => shown.extend_from_slice(&b),
                    TerminalEvent::Exited(code) => exited = Some(code),
                }
            }
        })
        .await;
        let shown = String::from_utf8_lossy(&shown);
        assert!(ended.is_ok(), "{shown}");
        assert!(shown.contains("as-1000-in-/home/user"), "{shown}");
        assert_eq!(exited, Some(3), "{shown}");
        let nobody = space_proto::api::User::Name("nobody-by-that-name".into());
        match client.terminal_as(&sandbox, 24, 80, Some(&nobody)).await {
            Err(space_client::Error::Api { status, code, .. }) => {
                assert_eq!((status.as_u16(), code.as_str()), (400, "unknown_user"));
            }
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("a terminal as an unknown user opened"),
        }
    });
}

#[test]
fn an_uploaded_script_keeps_its_execute_bit_and_runs_and_mode_sets_the_mode() {
    let Some((c, id)) = started() else { return };
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("run.sh");
    std::fs::write(&script, "#!/bin/sh\necho ran-as-$(id -u)\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    ok(c.cli(&["fs", "put", &id, script.to_str().unwrap(), "/root/run.sh"]));
    assert_eq!(
        ok(c.cli(&["exec", &id, "--", "/root/run.sh"])),
        "ran-as-0\n"
    );
    ok(c.cli(&[
        "fs",
        "put",
        "--mode",
        "0600",
        &id,
        script.to_str().unwrap(),
        "/root/p",
    ]));
    let (status, _) = put(
        &c,
        &format!("/v1/sandboxes/{id}/files?path=/root/q&mode=4711"),
        b"x",
    );
    assert_eq!(status, 204);
    let (status, body) = put(
        &c,
        &format!("/v1/sandboxes/{id}/files?path=/root/r&mode=17777"),
        b"x",
    );
    assert_eq!(status, 400, "{body}");
    let (status, body) = put(
        &c,
        &format!("/v1/sandboxes/{id}/files?path=/root/r&mode=9"),
        b"x",
    );
    assert_eq!(status, 400, "{body}");
    // Without a mode an existing file keeps its own, a new one gets 0644.
    let (status, _) = put(&c, &format!("/v1/sandboxes/{id}/files?path=/root/q"), b"y");
    assert_eq!(status, 204);
    let (status, _) = put(
        &c,
        &format!("/v1/sandboxes/{id}/files?path=/root/new"),
        b"y",
    );
    assert_eq!(status, 204);
    let modes = ok(c.cli(&[
        "exec",
        &id,
        "--",
        "stat",
        "-c",
        "%a %n",
        "/root/run.sh",
        "/root/p",
        "/root/q",
        "/root/new",
    ]));
    assert_eq!(
        modes,
        "755 /root/run.sh\n600 /root/p\n4711 /root/q\n644 /root/new\n"
    );
}

/// A call through the edge with the admin key: (status, body).
fn call(c: &Cluster, method: &str, pq: &str) -> (u16, String) {
    let (status, out) = c.http(
        method,
        &format!("{}{pq}", c.url),
        Some(&format!("Bearer {}", c.admin_key)),
        b"",
    );
    (status, String::from_utf8_lossy(&out).into_owned())
}

#[test]
fn reads_stats_lists_and_removes_as_user_meet_the_accounts_permissions() {
    let Some((c, id)) = started() else { return };
    ok(c.cli(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "mkdir -p /root/private && echo secret > /root/private/s && chmod 700 /root/private \
         && mkdir -p /srv/open && chmod 755 /srv /srv/open && echo seen > /srv/open/f && chmod 644 /srv/open/f",
    ]));
    let base = format!("/v1/sandboxes/{id}");
    // Root (the default) reads what it made.
    assert_eq!(
        call(&c, "GET", &format!("{base}/files?path=/root/private/s")),
        (200, "secret\n".to_owned())
    );
    // As the user: root's closed directory stays closed to every kind of call.
    for (method, what) in [
        ("GET", "files?path=/root/private/s"),
        ("GET", "files/stat?path=/root/private/s"),
        ("GET", "files/list?path=/root/private"),
        ("DELETE", "files?path=/root/private/s"),
    ] {
        let (status, body) = call(&c, method, &format!("{base}/{what}&user=user"));
        assert_eq!(status, 403, "{method} {what} as user: {body}");
    }
    // Nothing was removed, and a uid is an account too.
    let (status, _) = call(
        &c,
        "GET",
        &format!("{base}/files/stat?path=/root/private/s&user=1000"),
    );
    assert_eq!(status, 403);
    assert_eq!(
        call(&c, "GET", &format!("{base}/files?path=/root/private/s")).0,
        200
    );
    // What the account may read it reads; what it may not remove it cannot.
    assert_eq!(
        call(
            &c,
            "GET",
            &format!("{base}/files?path=/srv/open/f&user=user")
        ),
        (200, "seen\n".to_owned())
    );
    let (status, body) = call(
        &c,
        "GET",
        &format!("{base}/files/list?path=/srv/open&user=user"),
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"f\""), "{body}");
    assert_eq!(
        call(
            &c,
            "DELETE",
            &format!("{base}/files?path=/srv/open/f&user=user")
        )
        .0,
        403
    );
    // Its own file it removes.
    let (status, _) = put(
        &c,
        &format!("{base}/files?path=/home/user/mine&user=user"),
        b"m",
    );
    assert_eq!(status, 204);
    assert_eq!(
        call(
            &c,
            "DELETE",
            &format!("{base}/files?path=/home/user/mine&user=user")
        )
        .0,
        204
    );
    // An unknown account does nothing.
    let (status, body) = call(
        &c,
        "GET",
        &format!("{base}/files?path=/srv/open/f&user=nobody-here"),
    );
    assert_eq!(status, 400, "{body}");
}

#[test]
fn an_upload_into_a_new_nested_directory_makes_its_parents_owned_like_the_file() {
    let Some((c, id)) = started() else { return };
    let (status, body) = put(
        &c,
        &format!("/v1/sandboxes/{id}/files?path=/root/a/b/c/f"),
        b"deep",
    );
    assert_eq!(status, 204, "{body}");
    let (status, _) = put(
        &c,
        &format!("/v1/sandboxes/{id}/files?path=/home/user/x/y/f&user=user"),
        b"hers",
    );
    assert_eq!(status, 204);
    // mkdir=0 refuses a missing parent as before.
    let (status, body) = put(
        &c,
        &format!("/v1/sandboxes/{id}/files?path=/root/m/n/f&mkdir=0"),
        b"x",
    );
    assert_eq!(status, 404, "{body}");
    // As the user, root's directories stay closed.
    let (status, _) = put(
        &c,
        &format!("/v1/sandboxes/{id}/files?path=/root/z&user=user"),
        b"x",
    );
    assert_eq!(status, 403);
    let out = ok(c.cli(&[
        "exec",
        &id,
        "--",
        "stat",
        "-c",
        "%a %U %n",
        "/root/a",
        "/root/a/b/c",
        "/root/a/b/c/f",
        "/home/user/x",
        "/home/user/x/y/f",
    ]));
    assert_eq!(
        out,
        "755 root /root/a\n755 root /root/a/b/c\n644 root /root/a/b/c/f\n\
         755 user /home/user/x\n644 user /home/user/x/y/f\n"
    );
    assert_eq!(ok(c.cli(&["fs", "get", &id, "/root/a/b/c/f", "-"])), "deep");
}

/// `(relative path, kind, mode, content or link target)` of every entry under `root`.
fn tree(root: &Path) -> Vec<(String, char, u32, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let md = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let mode = md.mode() & 0o7777;
            if md.file_type().is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.push((rel, 'l', 0, t.display().to_string().into_bytes()));
            } else if md.is_dir() {
                out.push((rel, 'd', mode, Vec::new()));
                stack.push(p);
            } else {
                out.push((rel, 'f', mode, std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_directory_round_trips_through_put_r_and_get_r_with_its_symlink_and_modes() {
    let Some((c, id)) = started() else { return };
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("sub/deep")).unwrap();
    std::fs::write(src.join("run.sh"), "#!/bin/sh\necho tree-script\n").unwrap();
    std::fs::set_permissions(src.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(src.join("sub/deep/secret"), vec![7u8; 300_000]).unwrap();
    std::fs::set_permissions(
        src.join("sub/deep/secret"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::set_permissions(src.join("sub"), std::fs::Permissions::from_mode(0o750)).unwrap();
    symlink("sub/deep/secret", src.join("link")).unwrap();
    ok(c.cli(&[
        "fs",
        "put",
        "-r",
        &id,
        src.to_str().unwrap(),
        "/root/t/copy",
    ]));
    assert_eq!(
        ok(c.cli(&["exec", &id, "--", "/root/t/copy/run.sh"])),
        "tree-script\n"
    );
    let back = dir.path().join("back");
    ok(c.cli(&[
        "fs",
        "get",
        "-r",
        &id,
        "/root/t/copy",
        back.to_str().unwrap(),
    ]));
    assert_eq!(tree(&back), tree(&src));
    let mtime = |p: &Path| std::fs::metadata(p).unwrap().mtime();
    assert_eq!(mtime(&back.join("run.sh")), mtime(&src.join("run.sh")));
    // As the user: what is unpacked is its own.
    ok(c.cli(&[
        "fs",
        "put",
        "-r",
        "--user",
        "user",
        &id,
        src.to_str().unwrap(),
        "/home/user/t",
    ]));
    let owners = ok(c.cli(&[
        "exec",
        &id,
        "--",
        "stat",
        "-c",
        "%U",
        "/home/user/t",
        "/home/user/t/sub/deep/secret",
    ]));
    assert_eq!(owners, "user\nuser\n");
}

#[test]
fn an_archive_with_a_dotdot_entry_is_refused_inside_the_sandbox() {
    let Some((c, id)) = started() else { return };
    let tar = archive(&[
        ("fine", tar::EntryType::Regular, b"ok", None),
        ("../escaped", tar::EntryType::Regular, b"no", None),
    ]);
    let (status, body) = put(
        &c,
        &format!("/v1/sandboxes/{id}/files/tar?path=/root/in"),
        &tar,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("..") && body.contains("escaped"), "{body}");
    let out = ok(c.cli(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "ls /root/in; ls /root/escaped 2>&1; true",
    ]));
    assert!(
        out.starts_with("fine\n") && out.contains("No such file"),
        "{out}"
    );
    // A symlink planted by the sandbox does not redirect an upload either.
    ok(c.cli(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "mkdir -p /root/in2 /tmp/target && ln -s /tmp/target /root/in2/d",
    ]));
    let tar = archive(&[("d/file", tar::EntryType::Regular, b"x", None)]);
    let (status, _) = put(
        &c,
        &format!("/v1/sandboxes/{id}/files/tar?path=/root/in2"),
        &tar,
    );
    assert_eq!(status, 400);
    assert_eq!(
        ok(c.cli(&["exec", &id, "--", "ls", "-A", "/tmp/target"])),
        ""
    );
}

/// A hand-made archive (names `tar::Builder` would refuse included): name, type,
/// content, link target.
fn archive(entries: &[(&str, tar::EntryType, &[u8], Option<&str>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, kind, data, link) in entries {
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(l) = link {
            h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
        h.set_entry_type(*kind);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

/// A stand-in edge on loopback that answers every request with `tar` as a directory
/// read: what a compromised sandbox (its agent) could send `space fs get -r`.
fn hostile_edge(tar: Vec<u8>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/x-tar\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                tar.len()
            );
            let _ = conn.write_all(answer.as_bytes());
            let _ = conn.write_all(&tar);
        }
    });
    url
}

#[test]
fn a_hostile_tree_cannot_make_get_r_write_outside_the_local_directory() {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().display().to_string();
    let escape = format!("../{}-escaped", std::process::id());
    let tar = archive(&[
        ("link", tar::EntryType::Symlink, b"", Some(&target)),
        ("link/file", tar::EntryType::Regular, b"pwned", None),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let run = |tar: Vec<u8>, local: &Path| {
        std::process::Command::new(space_bin())
            .args([
                "fs",
                "get",
                "-r",
                &SandboxId::from_bytes([0x11; 16]).to_string(),
                "/root",
            ])
            .arg(local)
            .env("SPACE_URL", hostile_edge(tar))
            .env("SPACE_API_KEY", "test-key")
            .output()
            .unwrap()
    };
    let local = dir.path().join("a");
    let out = run(tar, &local);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("symlink"),
        "{out:?}"
    );
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    // The link itself is only a link: kept, never followed.
    assert!(
        std::fs::symlink_metadata(local.join("link"))
            .unwrap()
            .file_type()
            .is_symlink()
    );

    for (name, kind) in [
        (escape.as_str(), tar::EntryType::Regular),
        ("/tmp/space-absolute-escape", tar::EntryType::Regular),
        ("dev", tar::EntryType::Char),
    ] {
        let local = dir.path().join("b");
        let out = run(archive(&[(name, kind, b"x", None)]), &local);
        assert!(!out.status.success(), "{name}: {}", text(&out));
        assert!(!dir.path().join(&escape[3..]).exists());
        assert!(!Path::new("/tmp/space-absolute-escape").exists());
        assert!(!local.join("dev").exists());
    }
    // Setuid bits do not survive the trip to the user's machine.
    let mut h = tar::Header::new_gnu();
    h.set_path("suid").unwrap();
    h.set_mode(0o4755);
    h.set_size(1);
    h.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&h, &b"x"[..]).unwrap();
    let local = dir.path().join("c");
    let out = run(b.into_inner().unwrap(), &local);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::metadata(local.join("suid")).unwrap().mode() & 0o7777,
        0o755
    );
}
