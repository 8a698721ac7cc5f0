//! The Rust SDK (`space-client`) against a real `space up` with two workers: direct
//! mode sends operations to the worker (not the edge), follows a migration with one
//! rebuilt attempt, shares one resolve among concurrent operations, and surfaces
//! refusals.

use space_client::{Client, CreateSandbox, ExecEvent, Options, exec};
use space_identity::{SandboxId, WorkerId};
use space_testkit::cluster as support;
use support::{Cluster, can_run_jails};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A control-plane metric, read from a thread of its own (the harness's blocking
/// HTTP call starts a runtime, which cannot happen inside the test's).
fn metric(c: &Cluster, name: &str) -> f64 {
    std::thread::scope(|s| s.spawn(|| c.control_metric(name)).join().expect("metric"))
}

/// Requests the edge answered on `route` (its template), any status.
fn edge_requests(c: &Cluster, route: &str) -> f64 {
    ["1xx", "2xx", "4xx", "5xx"]
        .iter()
        .map(|s| {
            metric(
                c,
                &format!(r#"space_control_requests_total{{route="{route}",status="{s}"}}"#),
            )
        })
        .sum()
}

fn capabilities_issued(c: &Cluster) -> f64 {
    metric(c, "space_control_capabilities_issued_total")
}

fn on(worker: &str) -> CreateSandbox {
    CreateSandbox {
        worker: Some(worker.parse::<WorkerId>().expect("worker id")),
        ..CreateSandbox::default()
    }
}

/// A cluster, an admin's client in direct mode and a runtime; `None` (the test skips)
/// where jails cannot run.
fn start() -> Option<(Cluster, Client, tokio::runtime::Runtime)> {
    if !can_run_jails() {
        return None;
    }
    let c = Cluster::start();
    let client = Client::new(&c.url, &c.admin_key);
    Some((c, client, runtime()))
}

#[test]
fn direct_mode_runs_exec_and_files_on_the_worker_without_the_edge() {
    let Some((c, client, rt)) = start() else {
        return;
    };
    rt.block_on(async {
        let s = client.create_sandbox(&on("w1")).await.expect("create");
        let id = s.id;
        let capabilities = capabilities_issued(&c);
        let out = client
            .exec(
                &id,
                &exec([
                    "sh",
                    "-c",
                    "mkdir /root/dir; echo out; echo err >&2; exit 3",
                ]),
            )
            .await
            .expect("exec");
        assert_eq!(
            (out.exit_code, out.stdout.as_str(), out.stderr.as_str()),
            (3, "out\n", "err\n")
        );
        assert_eq!(
            Some(out.execution_id),
            s.execution.as_ref().map(|e| e.execution_id)
        );
        client
            .write_file(&id, "/root/dir/a b.txt", "direct bytes")
            .await
            .expect("write");
        assert_eq!(
            client
                .read_file(&id, "/root/dir/a b.txt")
                .await
                .expect("read"),
            "direct bytes"
        );
        let entries = client.list_files(&id, "/root/dir").await.expect("list");
        assert_eq!(
            entries
                .iter()
                .map(|e| (e.name.as_str(), e.kind.as_str(), e.size))
                .collect::<Vec<_>>(),
            [("a b.txt", "file", 12)]
        );
        client
            .remove_file(&id, "/root/dir/a b.txt")
            .await
            .expect("remove");
        let gone = client
            .read_file(&id, "/root/dir/a b.txt")
            .await
            .expect_err("removed");
        assert_eq!(gone.status().map(|s| s.as_u16()), Some(404), "{gone}");
        // One capability served all of it, and the edge forwarded none of it.
        assert_eq!(capabilities_issued(&c) - capabilities, 1.0);
        for route in [
            "/v1/sandboxes/{id}/exec",
            "/v1/sandboxes/{id}/files",
            "/v1/sandboxes/{id}/files/list",
        ] {
            assert_eq!(edge_requests(&c, route), 0.0, "{route}");
        }
        // Through the edge, the same operations give the same answers.
        let via_edge = Client::with_options(
            &c.url,
            &c.admin_key,
            Options {
                direct: false,
                ..Options::default()
            },
        );
        via_edge
            .write_file(&id, "/root/e.txt", "edge bytes")
            .await
            .expect("write via edge");
        assert_eq!(
            client.read_file(&id, "/root/e.txt").await.expect("read"),
            "edge bytes"
        );
        let out = via_edge
            .exec(&id, &exec(["cat", "/root/e.txt"]))
            .await
            .expect("exec via edge");
        assert_eq!(out.stdout, "edge bytes");
        assert!(edge_requests(&c, "/v1/sandboxes/{id}/exec") >= 1.0);
        assert!(edge_requests(&c, "/v1/sandboxes/{id}/files") >= 1.0);
        // Lifecycle through the SDK.
        let listed = client.sandboxes().await.expect("list");
        assert!(listed.iter().any(|x| x.id == id));
        client.delete_sandbox(&id).await.expect("delete");
        let stopped = client
            .sandbox(&id)
            .await
            .expect("a deleted sandbox is shown");
        assert_eq!(
            (stopped.state, stopped.execution),
            (space_client::SandboxState::Stopped, None)
        );
        let e = client
            .read_file(&id, "/root/e.txt")
            .await
            .expect_err("deleted sandbox");
        assert!(
            matches!(e.status().map(|s| s.as_u16()), Some(403 | 404 | 409)),
            "{e}"
        );
    });
}

#[test]
fn direct_mode_follows_a_migration_and_a_resume_elsewhere_with_one_shared_resolve() {
    let Some((c, client, rt)) = start() else {
        return;
    };
    rt.block_on(async {
        let s = client.create_sandbox(&on("w1")).await.expect("create");
        let id = s.id;
        client
            .write_file(&id, "/root/keep.txt", "moves along")
            .await
            .expect("write");
        let migrated = client
            .migrate(&id, &"w2".parse::<WorkerId>().expect("id"))
            .await
            .expect("migrate");
        let new_execution = migrated.execution.expect("execution");
        assert_eq!(new_execution.worker.as_str(), "w2");
        // The cached route names w1's retired execution: w1 answers 421, the client
        // resolves once and the operation runs at w2's execution. Sixteen operations at
        // once share that one resolve.
        let capabilities = capabilities_issued(&c);
        let mut tasks = Vec::new();
        for i in 0..16 {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                if i % 2 == 0 {
                    let data = client.read_file(&id, "/root/keep.txt").await?;
                    assert_eq!(data, "moves along");
                    Ok(None)
                } else {
                    let out = client.exec(&id, &exec(["cat", "/root/keep.txt"])).await?;
                    assert_eq!(out.stdout, "moves along");
                    Ok(Some(out.execution_id))
                }
            }));
        }
        for t in tasks {
            let ran_at: Result<_, space_client::Error> = t.await.expect("task");
            if let Some(e) = ran_at.expect("operation across the migration") {
                assert_eq!(e, new_execution.execution_id);
            }
        }
        assert_eq!(capabilities_issued(&c) - capabilities, 1.0);

        // Pause: no capability is issued for a paused sandbox, and the cached one is
        // refused by the worker; the error says so. Resume on w1 (a new execution).
        client.pause(&id).await.expect("pause");
        let e = client.exec(&id, &exec(["true"])).await.expect_err("paused");
        assert!(e.status().is_some(), "{e}");
        let resumed = client
            .resume(&id, Some(&"w1".parse::<WorkerId>().expect("id")))
            .await
            .expect("resume");
        let resumed = resumed.execution.expect("execution");
        assert_eq!(resumed.worker.as_str(), "w1");
        let out = client
            .exec(&id, &exec(["cat", "/root/keep.txt"]))
            .await
            .expect("exec after resume");
        assert_eq!(
            (out.stdout.as_str(), out.execution_id),
            ("moves along", resumed.execution_id)
        );
    });
}

#[test]
fn another_tenants_sandbox_is_refused_and_unknown_ones_are_not_found() {
    let Some((c, admin, rt)) = start() else {
        return;
    };
    rt.block_on(async {
        let mine = admin.create_sandbox(&on("w1")).await.expect("create");
        admin
            .write_file(&mine.id, "/root/mine.txt", "mine")
            .await
            .expect("write");
        let (status, body) = std::thread::scope(|s| {
            s.spawn(|| {
                c.http(
                    "POST",
                    &format!("{}/v1/tenants", c.url),
                    Some(&format!("Bearer {}", c.admin_key)),
                    br#"{"name":"other"}"#,
                )
            })
            .join()
            .expect("tenant")
        });
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
        let tenant: serde_json::Value = serde_json::from_slice(&body).expect("json");
        let other = Client::new(&c.url, tenant["api_key"].as_str().expect("key"));
        let e = other
            .read_file(&mine.id, "/root/mine.txt")
            .await
            .expect_err("another tenant's sandbox");
        assert!(
            matches!(e.status().map(|s| s.as_u16()), Some(403 | 404)),
            "{e}"
        );
        let unknown = SandboxId::from_bytes([7; 16]);
        let e = admin
            .exec(&unknown, &exec(["true"]))
            .await
            .expect_err("unknown");
        assert_eq!(e.code(), Some("not_found"), "{e}");
        let bad_key = Client::new(&c.url, "space_notakey");
        let e = bad_key.sandboxes().await.expect_err("bad key");
        assert_eq!(e.status().map(|s| s.as_u16()), Some(401), "{e}");
        // The owner's client still reads it.
        assert_eq!(
            admin
                .read_file(&mine.id, "/root/mine.txt")
                .await
                .expect("read"),
            "mine"
        );
    });
}

#[test]
fn streams_open_on_the_worker_and_follow_a_migration() {
    let Some((c, client, rt)) = start() else {
        return;
    };
    rt.block_on(async {
        let id = client.create_sandbox(&on("w1")).await.expect("create").id;
        let run = |client: Client| async move {
            let mut stream = client
                .exec_stream(
                    &id,
                    &exec([
                        "sh",
                        "-c",
                        "echo out; echo err >&2; sleep 0.2; echo more; exit 4",
                    ]),
                )
                .await
                .expect("open");
            let (mut out, mut err, mut exited) = (Vec::new(), Vec::new(), None);
            while let Some(event) = stream.next().await {
                match event.expect("event") {
                    ExecEvent::Stdout(b) => out.extend_from_slice(&b),
                    ExecEvent::Stderr(b) => err.extend_from_slice(&b),
                    ExecEvent::Exited(code) => exited = Some(code),
                    ExecEvent::Started { .. } => {}
                }
            }
            (out, err, exited)
        };
        let expected = (b"out\nmore\n".to_vec(), b"err\n".to_vec(), Some(4));
        assert_eq!(run(client.clone()).await, expected);
        assert_eq!(edge_requests(&c, "/v1/sandboxes/{id}/exec/stream"), 0.0);
        // A watch sees a file written afterwards.
        let mut watch = client.watch(&id, "/root", false).await.expect("watch");
        client
            .write_file(&id, "/root/seen.txt", "x")
            .await
            .expect("write");
        let event = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            loop {
                let e = watch.next().await.expect("open").expect("event");
                if e.to_string().contains("seen.txt") {
                    return e;
                }
            }
        })
        .await
        .expect("an event for the file");
        assert!(event.to_string().contains("seen.txt"), "{event}");
        drop(watch);
        // After a migration the cached route is stale: the stream opens at w2.
        client
            .migrate(&id, &"w2".parse::<WorkerId>().expect("id"))
            .await
            .expect("migrate");
        assert_eq!(run(client.clone()).await, expected);
        // Through the edge, the same.
        let via_edge = Client::with_options(
            &c.url,
            &c.admin_key,
            Options {
                direct: false,
                ..Options::default()
            },
        );
        assert_eq!(run(via_edge).await, expected);
        assert_eq!(edge_requests(&c, "/v1/sandboxes/{id}/exec/stream"), 1.0);
    });
}

#[test]
fn a_terminal_runs_a_shell_on_the_worker_and_ends_with_its_exit_code() {
    let Some((c, client, rt)) = start() else {
        return;
    };
    rt.block_on(async {
        let id = client.create_sandbox(&on("w2")).await.expect("create").id;
        let mut term = client.terminal(&id, 30, 100).await.expect("terminal");
        term.resize(40, 120).await.expect("resize");
        term.send("stty size; echo to-the-$((6*7)); exit 5\n")
            .await
            .expect("type");
        let (mut shown, mut exited) = (Vec::new(), None);
        let ended = tokio::time::timeout(std::time::Duration::from_secs(20), async {
            while let Some(event) = term.next().await {
                match event.expect("event") {
                    space_client::TerminalEvent::Output(b) => shown.extend_from_slice(&b),
                    space_client::TerminalEvent::Exited(code) => exited = Some(code),
                }
            }
        })
        .await;
        let shown = String::from_utf8_lossy(&shown);
        assert!(ended.is_ok(), "the shell did not end: {shown}");
        assert!(shown.contains("to-the-42"), "{shown}");
        assert!(shown.contains("40 120"), "{shown}");
        assert_eq!(exited, Some(5), "{shown}");
        assert_eq!(edge_requests(&c, "/v1/sandboxes/{id}/terminal"), 0.0);
    });
}
