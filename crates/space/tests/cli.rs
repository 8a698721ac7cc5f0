//! The CLI against a real `space up`: one `space up` (and one worker) per data
//! directory, stdin through `space exec` (plain and `--stream`), the outcome of a
//! program that cannot run, the one format of every CLI error, and what `sandbox get`
//! says of a sandbox's network.

use std::io::{Read, Write};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use space_testkit::cluster as support;
use support::{Cluster, can_run_jails, kill9, space_bin};

/// `len` bytes that never repeat a 16-byte block (a counter through a mixing
/// function): a lost, doubled or reordered chunk changes the digest.
fn non_repeating(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 16);
    let mut n: u64 = 0x9e37_79b9_7f4a_7c15;
    while out.len() < len {
        n = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = n;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        out.extend_from_slice(&z.to_le_bytes());
        out.extend_from_slice(&n.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Text of `len` bytes, no line like another: `line N <hex>` lines.
fn non_repeating_text(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 64);
    let mut i = 0u64;
    while out.len() < len {
        let _ = writeln!(
            out,
            "line {i} {:016x}",
            i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        );
        i += 1;
    }
    out.truncate(len);
    out
}

/// `sha256sum` of `data` on the host.
fn sha256(data: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha256sum on the host");
    let mut input = child.stdin.take().unwrap();
    let data = data.to_vec();
    let feeder = std::thread::spawn(move || input.write_all(&data));
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

/// The CLI with `stdin` written by a thread while its output is read (a command that
/// echoes its input would otherwise fill the pipes both ways), killed after `limit`.
fn cli_feeding(c: &Cluster, args: &[&str], stdin: Vec<u8>, limit: Duration) -> Output {
    let mut child = Command::new(space_bin())
        .args(args)
        .env("SPACE_URL", &c.url)
        .env("SPACE_API_KEY", &c.admin_key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        let _ = input.write_all(&stdin);
    });
    let pid = child.id() as i32;
    let watchdog = std::thread::spawn(move || {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            if std::fs::metadata(format!("/proc/{pid}")).is_err() {
                return false;
            }
        }
        kill9(pid);
        true
    });
    let out = child.wait_with_output().unwrap();
    let _ = feeder.join();
    let killed = watchdog.join().unwrap();
    assert!(
        !killed,
        "`space {}` hung (killed after {limit:?}); stderr: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A second `space up` on `data`, given `limit` to exit by itself. Its output goes to
/// files, not pipes: a second start that is not refused must fail this test, not hang
/// it on pipes its workers hold.
fn second_up(data: &std::path::Path, limit: Duration) -> Output {
    let out_dir = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (out_dir.path().join("out"), out_dir.path().join("err"));
    let mut child = Command::new(space_bin())
        .args([
            "up",
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "2",
            "--data-dir",
        ])
        .arg(data)
        .env("SPACE_LOG", "warn")
        .env("SPACE_WARM_POOL", "0")
        .env("SPACE_STANDBY", "0")
        // No egress: the test needs none, and leaves no table or link behind.
        .env("SPACE_NO_EGRESS", "1")
        // The host's directories as the default template (no image built).
        .env("SPACE_DEFAULT_TEMPLATE", "host")
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
        if Instant::now() >= deadline {
            // Stopped as `space up` is (its workers with it).
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = child.wait();
            panic!(
                "a second `space up` on a used data directory kept running; stdout: {} stderr: {}",
                std::fs::read_to_string(&out_path).unwrap_or_default(),
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: std::fs::read(&out_path).unwrap(),
        stderr: std::fs::read(&err_path).unwrap(),
    }
}

/// Every file under `dir` with its size and modification time.
fn tree(dir: &std::path::Path) -> Vec<(String, u64, std::time::SystemTime)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(meta) = e.path().symlink_metadata() else {
                continue;
            };
            let name = e.path().display().to_string();
            if meta.is_dir() {
                stack.push(e.path());
            } else if meta.is_file() && !name.contains("-wal") && !name.contains("-shm") {
                out.push((name, meta.len(), meta.modified().unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_second_space_up_on_a_used_data_directory_is_refused() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    let workers = (c.worker_pid("w1"), c.worker_pid("w2"));
    let data = c.data_dir();
    let lock = data.join("space.lock");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&lock).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // Its keys, records and the workers' files, as they are before the second start.
    let keys_before: Vec<_> = tree(&data)
        .into_iter()
        .filter(|(n, ..)| n.ends_with(".key"))
        .collect();

    let started = Instant::now();
    let out = second_up(&data, Duration::from_secs(10));
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused only after {:?}",
        started.elapsed()
    );
    let expected = format!(
        "space: error: another `space up` (pid {}, listening on {}, started ",
        c.edge_pid(),
        c.url
    );
    assert!(
        err.contains(&expected) && err.contains(&data.display().to_string()),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "it said it was up: {:?}", out.stdout);

    // It touched nothing: same keys, same workers, and the first serves as before.
    let keys_after: Vec<_> = tree(&data)
        .into_iter()
        .filter(|(n, ..)| n.ends_with(".key"))
        .collect();
    assert_eq!(keys_before, keys_after);
    assert_eq!((c.worker_pid("w1"), c.worker_pid("w2")), workers);
    let echo = c.cli(&["exec", &id, "--", "echo", "still served"]);
    assert!(echo.status.success(), "{}", stderr(&echo));
    assert_eq!(echo.stdout, b"still served\n");
    let list = c.cli(&["sandbox", "list"]);
    assert!(list.status.success(), "{}", stderr(&list));
    assert!(String::from_utf8_lossy(&list.stdout).contains(&id));

    // `space control` on it is refused the same way.
    let out = Command::new(space_bin())
        .args(["control", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains(&expected), "{}", stderr(&out));
    assert_eq!((c.worker_pid("w1"), c.worker_pid("w2")), workers);
}

#[test]
fn a_second_worker_on_one_data_directory_is_refused() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    let w1 = c.worker_pid("w1");
    let dir = c.worker_dir("w1");
    let records_before = tree(&dir);
    let err_dir = tempfile::tempdir().unwrap();
    let err_path = err_dir.path().join("err");
    let mut second = Command::new(space_bin())
        .args(["worker", "--id", "w1", "--control", &c.url])
        // No egress table: a test's killed worker must not leave one behind.
        .env("SPACE_NO_EGRESS", "1")
        .arg("--enroll-secret-file")
        .arg(c.data_dir().join("enroll.key"))
        .arg("--data-dir")
        .arg(&dir)
        .args(["--warm-pool", "0"])
        .env("SPACE_LOG", "warn")
        // Files, not pipes: what a second worker that is not refused starts would
        // hold a pipe open (and hang this test instead of failing it).
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(second.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = second.wait();
            panic!(
                "a second worker on a used data directory kept running: {}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = Output {
        status,
        stdout: Vec::new(),
        stderr: std::fs::read(&err_path).unwrap(),
    };
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "another `space worker w1` (pid {w1}, listening on http://"
        )) && err.contains(&dir.display().to_string()),
        "{err}"
    );
    assert_eq!(
        tree(&dir),
        records_before,
        "the refused worker wrote something"
    );
    assert_eq!(c.worker_pid("w1"), w1);
    let echo = c.cli(&["exec", &id, "--", "echo", "w1 still serves"]);
    assert!(echo.status.success(), "{}", stderr(&echo));
    assert_eq!(echo.stdout, b"w1 still serves\n");
}

#[test]
fn a_killed_space_up_leaves_no_lock_behind() {
    if !can_run_jails() {
        return;
    }
    let mut c = Cluster::start();
    let id = c.create(&[]);
    let old = (c.edge_pid(), c.worker_pid("w1"), c.worker_pid("w2"));
    // The workers (and what they start) do not hold `space up`'s lock: it is
    // close-on-exec.
    let lock = c.data_dir().join("space.lock");
    for pid in [old.1, old.2] {
        for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
        {
            assert_ne!(
                std::fs::read_link(fd.path()).ok().as_deref(),
                Some(lock.as_path()),
                "worker {pid} inherited the lock"
            );
        }
    }
    // kill -9 of `space up` alone: its lock file stays, its workers notice and go.
    kill9(old.0);
    let deadline = Instant::now() + Duration::from_secs(10);
    for pid in [old.1, old.2] {
        while std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| !s.contains(") Z "))
        {
            assert!(
                Instant::now() < deadline,
                "worker {pid} outlived its space up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    assert!(c.data_dir().join("space.lock").exists());
    // A new start on the same directory succeeds (two workers), and serves the
    // sandbox of the first.
    c.restart();
    assert_ne!(c.edge_pid(), old.0);
    let record = std::fs::read_to_string(c.data_dir().join("space.lock")).unwrap();
    assert!(
        record.contains(&format!("pid={}", c.edge_pid())),
        "{record}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let echo = c.cli(&["exec", &id, "--", "echo", "back"]);
        if echo.status.success() {
            assert_eq!(echo.stdout, b"back\n");
            break;
        }
        assert!(Instant::now() < deadline, "{}", stderr(&echo));
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn stdin_of_2_mib_reaches_exec_byte_for_byte() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    // The issue's case: a line piped in is printed back.
    let out = c.cli_with_stdin(&["exec", &id, "--", "cat"], b"x\n");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, b"x\n");

    // 2 MiB of bytes that are not text: the digest in the sandbox is the host's.
    let data = non_repeating(2 << 20);
    let out = cli_feeding(
        &c,
        &["exec", &id, "--", "sha256sum"],
        data.clone(),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout)[..64], sha256(&data));
    // And 2 MiB of text back through `cat`, byte for byte (the output fills its pipe
    // while stdin is still being written).
    let text = non_repeating_text(2 << 20);
    let out = cli_feeding(
        &c,
        &["exec", &id, "--", "cat"],
        text.clone(),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(out.stdout == text, "{} bytes back", out.stdout.len());
    // `-n` sends none.
    let out = c.cli_with_stdin(&["exec", "-n", &id, "--", "wc", "-c"], b"ignored");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0");
}

#[test]
fn stdin_of_2_mib_reaches_exec_byte_for_byte_with_stream() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    // The issue's case: it hung (stdin never closed).
    let out = cli_feeding(
        &c,
        &["exec", "--stream", &id, "--", "cat"],
        b"x\n".to_vec(),
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, b"x\n");

    let data = non_repeating(2 << 20);
    let out = cli_feeding(
        &c,
        &["exec", "--stream", &id, "--", "sha256sum"],
        data.clone(),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout)[..64], sha256(&data));
    // Binary bytes back through `cat`, exactly.
    let out = cli_feeding(
        &c,
        &["exec", "--stream", &id, "--", "cat"],
        data.clone(),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(out.stdout == data, "{} bytes back", out.stdout.len());
}

#[test]
fn exec_stdin_over_its_limit_is_a_clear_413() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    // The CLI refuses more than 64 MiB before sending anything.
    let out = cli_feeding(
        &c,
        &["exec", &id, "--", "wc", "-c"],
        vec![b'a'; (64 << 20) + 1],
        Duration::from_secs(60),
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.starts_with("space: error: stdin is over 64 MiB") && err.contains("--stream"),
        "{err}"
    );
    // A request that says it holds more is 413 `too_large` from the worker, as JSON.
    let b64 = "QUFB".repeat(((64 << 20) / 3) + 8);
    let body = format!(r#"{{"cmd":["wc","-c"],"stdin_base64":"{b64}"}}"#);
    let (status, answer) = c.http(
        "POST",
        &format!("{}/v1/sandboxes/{id}/exec", c.url),
        Some(&format!("Bearer {}", c.admin_key)),
        body.as_bytes(),
    );
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&answer));
    let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(v["error"], "too_large");
    // Both forms at once, or base64 that is not: 400, nothing run.
    for body in [
        r#"{"cmd":["true"],"stdin":"a","stdin_base64":"YQ=="}"#,
        r#"{"cmd":["true"],"stdin_base64":"not base64!"}"#,
    ] {
        let (status, answer) = c.http(
            "POST",
            &format!("{}/v1/sandboxes/{id}/exec", c.url),
            Some(&format!("Bearer {}", c.admin_key)),
            body.as_bytes(),
        );
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(&answer));
        let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(v["error"], "bad_request");
    }
    // One over the body limit is refused by the edge the same way.
    let body = vec![b' '; space_proto::api::MAX_EXEC_BODY + 1];
    let (status, answer) = c.http(
        "POST",
        &format!("{}/v1/sandboxes/{id}/exec", c.url),
        Some(&format!("Bearer {}", c.admin_key)),
        &body,
    );
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&answer));
    let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(v["error"], "too_large");
    // Just under the stdin limit goes through, whole, with the worker's memory bounded
    // by a few copies of the request (its body, its base64, the bytes).
    let worker = c.worker_pid(c.sandbox(&id)["execution"]["worker"].as_str().unwrap());
    let base = support::reset_peak(worker);
    let out = cli_feeding(
        &c,
        &["exec", &id, "--", "wc", "-c"],
        vec![b'a'; 64 << 20],
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (64u64 << 20).to_string()
    );
    let growth = support::peak_growth(worker, base);
    eprintln!(
        "64 MiB of stdin: worker peak RSS growth {} KiB",
        growth >> 10
    );
    assert!(growth < 320 << 20, "worker grew {growth} bytes");
}

#[test]
fn stdin_streams_through_cat_in_bounded_memory() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    let worker = c.worker_pid("w1");
    let edge = c.edge_pid();
    let (wbase, ebase) = (support::reset_peak(worker), support::reset_peak(edge));
    // 256 MiB through `cat` and back: every hop passes it on as it comes.
    let len = 256usize << 20;
    let mut child = Command::new(space_bin())
        .args(["exec", "--stream", &id, "--", "cat"])
        .env("SPACE_URL", &c.url)
        .env("SPACE_API_KEY", &c.admin_key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        let chunk = non_repeating(1 << 20);
        for _ in 0..(len >> 20) {
            if input.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    // A stall anywhere (a hop that stops reading one way while it writes the other)
    // is a CLI killed here, and a short count below.
    let cli = child.id() as i32;
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if done_rx.recv_timeout(Duration::from_secs(240)).is_err() {
            kill9(cli);
        }
    });
    let mut output = child.stdout.take().unwrap();
    let mut total = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = output.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        total += n;
    }
    let _ = done_tx.send(());
    watchdog.join().unwrap();
    feeder.join().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(total, len, "stalled: {total} of {len} bytes came back");
    assert!(status.success());
    let (wgrowth, egrowth) = (
        support::peak_growth(worker, wbase),
        support::peak_growth(edge, ebase),
    );
    eprintln!(
        "256 MiB through cat: peak RSS growth worker {} KiB, space up {} KiB",
        wgrowth >> 10,
        egrowth >> 10
    );
    assert!(wgrowth < 48 << 20, "worker grew {wgrowth} bytes");
    assert!(egrowth < 48 << 20, "space up grew {egrowth} bytes");
}

#[test]
fn exec_of_a_missing_binary_exits_127_with_a_clear_message() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    for stream in [false, true] {
        let mut args = vec!["exec"];
        if stream {
            args.push("--stream");
        }
        args.extend([id.as_str(), "--", "no-such-command", "arg"]);
        let out = c.cli(&args);
        assert_eq!(
            out.status.code(),
            Some(127),
            "stream {stream}: {}",
            stderr(&out)
        );
        assert_eq!(
            stderr(&out),
            "space: no-such-command: command not found\n",
            "stream {stream}"
        );
        let mut args = vec!["exec"];
        if stream {
            args.push("--stream");
        }
        args.extend([id.as_str(), "--", "/etc/passwd"]);
        let out = c.cli(&args);
        assert_eq!(
            out.status.code(),
            Some(126),
            "stream {stream}: {}",
            stderr(&out)
        );
        assert_eq!(
            stderr(&out),
            "space: /etc/passwd: permission denied\n",
            "stream {stream}"
        );
    }
    // The API says so too.
    let out = c.cli(&["--json", "exec", &id, "--", "no-such-command"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["exit_code"], 127);
}

#[test]
fn watch_on_a_missing_path_is_not_found() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    let out = c.cli(&["watch", &id, "/no/such/dir"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.starts_with("space: error: ") && err.contains("(not_found, HTTP 404)"),
        "{err}"
    );
}

#[test]
fn cli_errors_share_one_format() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    let missing = "sbx_00000000000000000000000000";
    let cases: Vec<Vec<&str>> = vec![
        vec!["sandbox", "get", missing],
        vec!["sandbox", "rm", missing],
        vec!["exec", missing, "--", "true"],
        vec!["exec", "--stream", missing, "--", "true"],
        vec!["watch", &id, "/no/such/dir"],
        vec!["term", missing],
        vec!["fs", "ls", &id, "/no/such/dir"],
        vec!["sandbox", "create", "--memory-mib", "1"],
        vec!["sandbox", "migrate", &id, "--worker", "nope"],
    ];
    for args in cases {
        let out = c.cli_with_stdin(&args, b"");
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?}");
        let line = err.trim_end();
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        let tail = line
            .strip_prefix("space: error: ")
            .unwrap_or_else(|| panic!("{args:?}: {err}"));
        // MESSAGE (CODE[: REASON], HTTP STATUS)
        let (message, meta) = tail
            .rsplit_once(" (")
            .unwrap_or_else(|| panic!("{args:?}: {err}"));
        let meta = meta.strip_suffix(')').unwrap();
        let (code, http) = meta
            .rsplit_once(", HTTP ")
            .unwrap_or_else(|| panic!("{args:?}: {err}"));
        assert!(!message.is_empty(), "{args:?}: {err}");
        assert!(
            !code.is_empty()
                && code
                    .chars()
                    .all(|ch| ch.is_ascii_lowercase() || "_: ".contains(ch)),
            "{args:?}: {err}"
        );
        let status: u16 = http.parse().unwrap();
        assert!((400..600).contains(&status), "{args:?}: {err}");
    }
    // A wrong key: the same form.
    let out = Command::new(space_bin())
        .args(["sandbox", "list"])
        .env("SPACE_URL", &c.url)
        .env("SPACE_API_KEY", "wrong")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(
        err.starts_with("space: error: ") && err.trim_end().ends_with(", HTTP 401)"),
        "{err}"
    );
}

#[test]
fn sdk_stdin_reaches_the_command_plain_and_streamed() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = space_client::Client::new(&c.url, &c.admin_key);
    let sandbox: space_identity::SandboxId = id.parse().unwrap();
    let data = non_repeating(2 << 20);
    rt.block_on(async {
        // Plain: bytes that are not text, more than one agent frame.
        let req = space_client::exec_with_stdin(["sha256sum"], &data);
        let out = client.exec(&sandbox, &req).await.unwrap();
        assert_eq!(out.exit_code, 0, "{}", out.stderr);
        assert_eq!(out.stdout[..64], sha256(&data));
        // Streamed: sent, then closed; `wc -c` ends and counts all of it.
        let mut stream = client
            .exec_stream(&sandbox, &space_client::exec(["wc", "-c"]))
            .await
            .unwrap();
        // One message larger than an agent frame (1 MiB): the worker cuts it.
        stream.send_stdin(data.clone()).await.unwrap();
        stream.close_stdin().await.unwrap();
        let mut out = Vec::new();
        loop {
            match stream.next().await.unwrap().unwrap() {
                space_client::ExecEvent::Stdout(b) => out.extend_from_slice(&b),
                space_client::ExecEvent::Stderr(_) | space_client::ExecEvent::Started { .. } => {}
                space_client::ExecEvent::Exited(code) => {
                    assert_eq!(code, 0);
                    break;
                }
            }
        }
        assert_eq!(
            String::from_utf8_lossy(&out).trim(),
            (2u64 << 20).to_string()
        );
    });
}

#[test]
fn sandbox_get_says_the_network_is_off_and_how_to_turn_it_on() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    let off = format!(
        "network: off (loopback only) — turn it on with: space sandbox network {id} --net egress [--allow NAME|CIDR …]"
    );
    let out = c.cli(&["sandbox", "get", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().last(), Some(off.as_str()), "{text}");
    // `space sandbox network ID` shows the same; `--json` the policy as the API does.
    let out = c.cli(&["sandbox", "network", &id]);
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim_end(), off);
    let out = c.cli(&["--json", "sandbox", "network", &id]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"mode": "none", "allow": [], "deny": []})
    );
    let out = c.cli(&["--json", "sandbox", "get", &id]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["network"]["mode"], "none");
    // Rules without `--net egress` are refused before anything is asked.
    for args in [
        vec!["sandbox", "create", "--allow", "pypi.org"],
        vec![
            "sandbox", "network", &id, "--net", "none", "--deny", "pypi.org",
        ],
    ] {
        let out = c.cli(&args);
        assert!(!out.status.success(), "{args:?}");
        assert_eq!(
            stderr(&out).trim_end(),
            "space: error: --allow and --deny need --net egress (without it the sandbox has no network)",
            "{args:?}"
        );
    }
}
