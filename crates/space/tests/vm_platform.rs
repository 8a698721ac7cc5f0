//! VM sandboxes through the platform (issue 18): `space up` with workers that run
//! `--substrate vm` (QEMU, software emulation here), a sandbox of a two-layer image
//! template created, used and paused through the edge like a jail — its own kernel,
//! its template's layers stacked in the guest (a whiteout and an opaque directory),
//! files, a terminal, a watch, a counter that keeps its memory across pause and
//! resume, servers on the guest's loopback reached through their service-port URLs
//! (before and after a migration) — a killed QEMU relaunched as a new execution with the sandbox's files, and
//! creates naming a substrate no worker runs refused, saying what there is.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use space_testkit::cluster as support;
use support::{Cluster, can_run_jails};

#[path = "vm/support.rs"]
mod vm_support;
#[path = "ports/wire.rs"]
#[allow(
    dead_code,
    reason = "the HTTP client of the ports tests; these use part of it"
)]
mod wire;

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

/// Why the VM tests cannot run here, if they cannot.
fn missing() -> Option<String> {
    if !can_run_jails() {
        return Some("needs root, namespaces and cgroups (see can_run_jails)".into());
    }
    vm_support::missing_vm()
}

/// Skips (saying why) where the VM tests cannot run, unless `SPACE_REQUIRE_VM=1`
/// (CI), which makes that a failure.
fn skip(reason: &str) {
    assert!(
        std::env::var_os("SPACE_REQUIRE_VM").is_none_or(|v| v != "1"),
        "SPACE_REQUIRE_VM=1, and the VM tests cannot run: {reason}"
    );
    eprintln!("SKIPPED: {reason}");
}

/// `space up` whose two workers run VM sandboxes, with the two-layer sample image
/// imported as `spacetest:1`.
fn vm_cluster() -> Option<Cluster> {
    vm_cluster_with(&[])
}

/// [`vm_cluster`] with more environment for `space up`.
fn vm_cluster_with(env: &[(&str, &str)]) -> Option<Cluster> {
    if let Some(reason) = missing() {
        skip(&reason);
        return None;
    }
    let kernel = vm_support::kernel_dir();
    let agent = space_testkit::static_agent();
    let mut all = vec![
        ("SPACE_AGENT", agent.to_str().unwrap()),
        ("SPACE_VM_WORKERS", "2"),
        ("SPACE_VM_KERNEL_DIR", kernel.to_str().unwrap()),
    ];
    all.extend_from_slice(env);
    let c = Cluster::start_with_env(&all);
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("image.tar");
    space_image::sample::write_docker_save(&archive, Path::new(vm_support::BUSYBOX)).unwrap();
    ok(c.cli(&[
        "template",
        "import",
        "spacetest:1",
        archive.to_str().unwrap(),
    ]));
    Some(c)
}

/// A VM sandbox of the sample template: 256 MiB of RAM, the default disk (1 GiB: its
/// image, mostly holes, is what a snapshot or a migration carries).
fn create_vm(c: &Cluster) -> String {
    c.create(&[
        "--template",
        "spacetest:1",
        "--substrate",
        "vm",
        "--memory-mib",
        "256",
    ])
}

fn sh(c: &Cluster, id: &str, script: &str) -> String {
    ok(c.cli(&["exec", id, "--", "sh", "-c", script]))
}

/// Starts, in the guest, a counter whose value lives only in a process's memory
/// (the file is its output), and waits until it has counted a few.
fn start_counter(c: &Cluster, id: &str) {
    sh(
        c,
        id,
        "sh -c 'i=0; while true; do i=$((i+1)); echo $i > /home/app/count; sleep 0.1; done' \
         >/dev/null 2>&1 &",
    );
    wait_until("the counter", Duration::from_secs(10), || {
        (counted(c, id) > 5).then_some(())
    });
}

/// The counter's value now (0 before it wrote one). The shell truncates the file
/// before each write: a read between the two finds it empty, and is made again.
fn counted(c: &Cluster, id: &str) -> u64 {
    for _ in 0..20 {
        if let Ok(n) = sh(c, id, "cat /home/app/count").trim().parse() {
            return n;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    0
}

fn wait_until<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_vm_sandbox_created_through_the_platform_runs_its_own_kernel_layers_files_terminal_and_watch() {
    let Some(c) = vm_cluster() else { return };
    let id = create_vm(&c);
    let s = c.sandbox(&id);
    assert_eq!(s["execution"]["substrate"], "vm", "{s}");

    // Its own kernel, not the host's.
    let host = ok(std::process::Command::new("uname")
        .arg("-r")
        .output()
        .unwrap());
    let guest = sh(&c, &id, "cat /proc/sys/kernel/osrelease");
    assert_ne!(
        guest.trim(),
        host.trim(),
        "the guest runs the host's kernel"
    );
    // The template's two layers, stacked in the guest as a jail stacks them: the top
    // layer's file, the base layer's file the top one whited out gone, the opaque
    // directory holding only the top layer's entry. No host directory inside.
    assert!(sh(&c, &id, "cat /etc/os-release").contains("VERSION_ID=2"));
    assert_eq!(
        sh(&c, &id, "test -e /etc/motd && echo there || echo gone").trim(),
        "gone"
    );
    assert_eq!(sh(&c, &id, "ls /dir").trim(), "new");
    assert_eq!(
        sh(
            &c,
            &id,
            "test -e /usr/bin || test -e /work && echo host || echo none"
        )
        .trim(),
        "none"
    );
    // The image's defaults: its user and working directory.
    assert_eq!(
        sh(&c, &id, "id -u; pwd")
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["1234", "/home/app"]
    );

    // Files in and out through the platform.
    let local = tempfile::tempdir().unwrap();
    let up = local.path().join("up.txt");
    std::fs::write(&up, b"into the guest\n").unwrap();
    ok(c.cli(&["fs", "put", &id, up.to_str().unwrap(), "/home/app/in.txt"]));
    assert_eq!(sh(&c, &id, "cat /home/app/in.txt"), "into the guest\n");
    let got = ok(c.cli(&["fs", "get", &id, "/home/app/in.txt"]));
    assert_eq!(got, "into the guest\n");

    // A terminal: a shell that answers and exits with its code.
    let out = c.cli_with_stdin(&["term", &id], b"echo term-$((20+22))\nexit 5\n");
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text(&out).contains("term-42"), "{}", text(&out));

    // A watch: a change in the guest reported.
    let mut watch = std::process::Command::new(support::space_bin())
        .args(["watch", &id, "/home/app"])
        .env("SPACE_URL", &c.url)
        .env("SPACE_API_KEY", &c.admin_key)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pipe = watch.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(pipe), &mut line).unwrap();
        line
    });
    let mut n = 0;
    wait_until("a watch event", Duration::from_secs(30), || {
        n += 1;
        sh(&c, &id, &format!("echo {n} > /home/app/watched-{n}"));
        reader.is_finished().then_some(())
    });
    let line = reader.join().unwrap();
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(line.contains("watched-"), "{line}");

    // A counter whose value lives in a process's memory keeps counting across a
    // pause and a resume in place (the vCPUs stopped, the same execution).
    start_counter(&c, &id);
    let count = || counted(&c, &id);
    let execution = c.sandbox(&id)["execution"]["execution_id"].clone();
    ok(c.cli(&["sandbox", "pause", &id]));
    assert_eq!(c.sandbox(&id)["state"], "paused");
    ok(c.cli(&["sandbox", "resume", &id]));
    let before = count();
    wait_until("counting on after resume", Duration::from_secs(10), || {
        (count() > before).then_some(())
    });
    assert_eq!(
        c.sandbox(&id)["execution"]["execution_id"],
        execution,
        "a pause in place keeps the execution"
    );
    ok(c.cli(&["sandbox", "rm", &id]));
}

/// A capability for `sandbox`'s current execution, straight from the control plane.
fn capability(c: &Cluster, sandbox: &str) -> serde_json::Value {
    let body = serde_json::json!({"access": ["exec"], "purpose": "control"}).to_string();
    let (status, body) = c.http(
        "POST",
        &format!("{}/v1/sandboxes/{sandbox}/capabilities", c.url),
        Some(&format!("Bearer {}", c.admin_key)),
        body.as_bytes(),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

/// `POST …/exec` at the worker `cap` names (or `worker_url`), with `cap`'s token.
fn direct_exec(c: &Cluster, cap: &serde_json::Value, worker_url: &str, id: &str) -> (u16, String) {
    let token = cap["token"].as_str().unwrap();
    let (status, body) = c.http(
        "POST",
        &format!("{worker_url}/v1/sandboxes/{id}/exec"),
        Some(&format!("SpaceCap {token}")),
        br#"{"cmd":["echo","direct"]}"#,
    );
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    (
        status,
        body["reason"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Whether a QEMU of `execution` runs (its serial socket is named after it).
fn qemu_of(execution: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
            let c = String::from_utf8_lossy(&c);
            c.contains("qemu-system") && c.contains(&format!("vm-{execution}.sock"))
        })
    })
}

#[test]
fn a_vm_migrated_to_the_other_worker_keeps_its_memory_closes_old_streams_and_the_old_capability_gets_421_at_both()
 {
    let Some(c) = vm_cluster_with(&[("SPACE_LOG", "info")]) else {
        return;
    };
    let id = create_vm(&c);
    let before = c.sandbox(&id)["execution"].clone();
    start_counter(&c, &id);
    let count = || counted(&c, &id);
    let old_cap = capability(&c, &id);
    // A stream bound to the old execution (a terminal, its shell there; a watch
    // would follow the sandbox to the new one): it ends with that execution.
    let mut term = std::process::Command::new(support::space_bin())
        .args(["term", &id])
        .env("SPACE_URL", &c.url)
        .env("SPACE_API_KEY", &c.admin_key)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        term.try_wait().unwrap().is_none(),
        "the terminal ended before the migration"
    );
    let target = if before["worker"] == "w1" { "w2" } else { "w1" };
    let out = c.cli(&["--json", "sandbox", "migrate", &id, "--worker", target]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(after["state"], "running");
    assert_eq!(after["execution"]["worker"], target);
    assert_eq!(after["execution"]["substrate"], "vm");
    assert_ne!(after["execution"]["execution_id"], before["execution_id"]);
    let ended = wait_until(
        "the old execution's terminal to end",
        Duration::from_secs(10),
        || term.try_wait().unwrap(),
    );
    assert!(
        !ended.success(),
        "the terminal ended as if its shell had exited: {ended}"
    );
    // The same process, its memory kept: the counter goes on from where it was, not
    // from 1 (a boot from the disk alone would have no counter at all).
    let moved = count();
    assert!(
        moved > 5,
        "the counter restarted after the migration: {moved}"
    );
    wait_until(
        "counting on after the migration",
        Duration::from_secs(10),
        || (count() > moved).then_some(()),
    );
    // The old execution's capability: the old worker answers from its tombstone, the
    // new one names the wrong worker. Never served by either.
    let old_url = old_cap["route"]["worker_url"].as_str().unwrap().to_owned();
    assert_eq!(
        direct_exec(&c, &old_cap, &old_url, &id),
        (421, "retired".into())
    );
    let new_url = capability(&c, &id)["route"]["worker_url"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(new_url, old_url);
    assert_eq!(
        direct_exec(&c, &old_cap, &new_url, &id),
        (421, "wrong_worker".into())
    );
    // No QEMU of the old execution is left; the new one's runs.
    let old_exe = before["execution_id"].as_str().unwrap();
    let new_exe = after["execution"]["execution_id"].as_str().unwrap();
    assert!(qemu_of(new_exe), "no QEMU runs the new execution");
    assert!(!qemu_of(old_exe), "the old execution's QEMU still runs");
}

/// The PID of worker `w`'s process, if one runs.
fn worker_process(c: &Cluster, w: &str) -> Option<i32> {
    let dir = c.worker_dir(w).display().to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let ours = args.iter().any(|a| a == "worker") && args.contains(&dir);
        ours.then_some(pid)
    })
}

#[test]
fn a_worker_killed_during_a_vm_snapshot_loses_nothing_acknowledged_and_the_vm_goes_on() {
    let points = tempfile::tempdir().unwrap();
    let point = "worker.snapshot.vm_written";
    let crash_at = format!("{point}@{}", points.path().display());
    let Some(c) = vm_cluster_with(&[("SPACE_CRASH_AT", &crash_at)]) else {
        return;
    };
    let id = create_vm(&c);
    let before = c.sandbox(&id)["execution"].clone();
    let w = before["worker"].as_str().unwrap().to_owned();
    let local = tempfile::tempdir().unwrap();
    let file = local.path().join("kept.txt");
    std::fs::write(&file, b"acknowledged before the snapshot\n").unwrap();
    ok(c.cli(&[
        "fs",
        "put",
        &id,
        file.to_str().unwrap(),
        "/home/app/kept.txt",
    ]));
    start_counter(&c, &id);
    let count = || counted(&c, &id);
    let pid = c.worker_pid(&w);
    // The worker dies by SIGKILL once QEMU has written the VM's memory, before the
    // snapshot is packed and answered.
    std::fs::write(points.path().join(point), b"").unwrap();
    let out = c.cli(&["sandbox", "snapshot", &id]);
    assert!(!out.status.success(), "the snapshot cannot have succeeded");
    assert!(
        !points.path().join(point).exists(),
        "the crash point was not reached"
    );
    // `space up` starts the worker again; it re-adopts the frozen VM, and the
    // abandoned snapshot thaws it: the same execution goes on, with its memory.
    wait_until("the worker back", Duration::from_secs(60), || {
        worker_process(&c, &w).filter(|p| *p != pid)
    });
    let after = wait_until("the sandbox running again", Duration::from_secs(90), || {
        let s = c.sandbox(&id);
        (s["state"] == "running").then_some(s)
    });
    assert_eq!(
        sh(&c, &id, "cat /home/app/kept.txt"),
        "acknowledged before the snapshot\n"
    );
    // The same execution, thawed (QEMU outlived its worker, stopped, and the
    // restarted worker re-adopted it): its memory too.
    assert_eq!(
        after["execution"]["execution_id"], before["execution_id"],
        "not the same execution after the crash"
    );
    let now = count();
    assert!(now > 5, "the same execution lost its counter: {now}");
    wait_until("counting on", Duration::from_secs(10), || {
        (count() > now).then_some(())
    });
    // The half-taken snapshot (a memory file as large as the guest's RAM) is gone.
    let spool = c.worker_dir(&w).join("spool").join("vm");
    let left = std::fs::read_dir(&spool).map_or(0, |d| d.count());
    assert_eq!(
        left,
        0,
        "a half-taken VM snapshot was left in {}",
        spool.display()
    );
}

#[test]
fn a_killed_qemu_is_relaunched_as_a_new_execution_with_the_sandboxs_files() {
    let Some(c) = vm_cluster() else { return };
    let id = create_vm(&c);
    let first = c.sandbox(&id)["execution"].clone();
    let local = tempfile::tempdir().unwrap();
    let file = local.path().join("kept.txt");
    std::fs::write(&file, b"acknowledged before the crash\n").unwrap();
    // An upload is fsynced by the agent before it is acknowledged.
    ok(c.cli(&[
        "fs",
        "put",
        &id,
        file.to_str().unwrap(),
        "/home/app/kept.txt",
    ]));
    // QEMU of this sandbox: the process whose command line names its serial socket.
    let qemu = wait_until("the sandbox's QEMU", Duration::from_secs(5), || {
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd);
            (cmd.contains("qemu-system") && cmd.contains(&id)).then_some(pid)
        })
    });
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(qemu).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let second = wait_until("a new execution", Duration::from_secs(60), || {
        let s = c.sandbox(&id);
        let e = s["execution"].clone();
        (s["state"] == "running" && e["generation"] != first["generation"]).then_some(e)
    });
    assert_ne!(second["execution_id"], first["execution_id"]);
    assert_eq!(second["substrate"], "vm");
    assert_eq!(
        sh(&c, &id, "cat /home/app/kept.txt"),
        "acknowledged before the crash\n"
    );
}

#[test]
fn a_create_naming_a_substrate_no_worker_runs_is_refused_saying_what_there_is() {
    if !can_run_jails() {
        eprintln!("SKIPPED: needs root, namespaces and cgroups (see can_run_jails)");
        return;
    }
    // Jail workers only (a `SPACE_SUBSTRATE` in `space up`'s environment does not
    // reach them: `space up` says each worker's substrate): a VM sandbox has nowhere
    // to go, and nothing is created.
    let c = Cluster::start_with_env(&[("SPACE_SUBSTRATE", "vm")]);
    let out = c.cli(&["sandbox", "create", "--substrate", "vm"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no worker of this platform runs vm sandboxes (its workers run: jail)"),
        "{err}"
    );
    let list = ok(c.cli(&["--json", "sandbox", "list"]));
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!(list.as_array().map(Vec::len), Some(0), "{list}");
    // Asking for a jail by name is the default's own placement.
    let id = c.create(&["--substrate", "jail"]);
    assert_eq!(c.sandbox(&id)["execution"]["substrate"], "jail");
}

/// `space up` with one jail worker (w1) and one VM worker (w2), the sample template
/// imported.
fn mixed_cluster() -> Option<Cluster> {
    vm_cluster_with(&[("SPACE_VM_WORKERS", "1")])
}

fn refused(out: &Output, says: &str) {
    assert!(!out.status.success(), "{}", text(out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(says), "{err}");
}

#[test]
fn on_a_platform_of_jail_and_vm_workers_no_sandbox_crosses_substrates() {
    let Some(c) = mixed_cluster() else { return };
    // A VM asked of the jail worker.
    refused(
        &c.cli(&[
            "sandbox",
            "create",
            "--template",
            "spacetest:1",
            "--substrate",
            "vm",
            "--worker",
            "w1",
        ]),
        "worker w1 runs jail sandboxes, not vm",
    );
    // A VM goes to the VM worker; the default (jail, not every worker is a VM
    // worker) to the jail worker.
    let vm = create_vm(&c);
    let vm_before = c.sandbox(&vm)["execution"].clone();
    assert_eq!(
        (
            vm_before["worker"].as_str(),
            vm_before["substrate"].as_str()
        ),
        (Some("w2"), Some("vm"))
    );
    let jail = c.create(&["--template", "spacetest:1"]);
    let jail_before = c.sandbox(&jail)["execution"].clone();
    assert_eq!(
        (
            jail_before["worker"].as_str(),
            jail_before["substrate"].as_str()
        ),
        (Some("w1"), Some("jail"))
    );
    // Neither migrates onto the other substrate, and each goes on where it was.
    refused(
        &c.cli(&["sandbox", "migrate", &vm, "--worker", "w1"]),
        "worker w1 runs jail sandboxes, not vm",
    );
    refused(
        &c.cli(&["sandbox", "migrate", &jail, "--worker", "w2"]),
        "worker w2 runs vm sandboxes, not jail",
    );
    // Nor does a snapshot resume there.
    ok(c.cli(&["sandbox", "snapshot", &jail]));
    refused(
        &c.cli(&["sandbox", "resume", &jail, "--worker", "w2"]),
        "worker w2 runs vm sandboxes, not jail",
    );
    ok(c.cli(&["sandbox", "resume", &jail]));
    for (id, before) in [(&vm, &vm_before), (&jail, &jail_before)] {
        let now = c.sandbox(id);
        assert_eq!(now["state"], "running", "{now}");
        assert_eq!(now["execution"]["execution_id"], before["execution_id"]);
        assert_eq!(sh(&c, id, "echo here").trim(), "here");
    }
}

/// The edge's address (the cluster's URL is `http://ip:port`).
fn edge(c: &Cluster) -> std::net::SocketAddr {
    c.url.strip_prefix("http://").unwrap().parse().unwrap()
}

/// `POST …/ports` with the admin key.
fn expose(c: &Cluster, id: &str, port: u16, protocol: &str) {
    let body = serde_json::json!({"port": port, "protocol": protocol}).to_string();
    let (status, body) = c.http(
        "POST",
        &format!("{}/v1/sandboxes/{id}/ports", c.url),
        Some(&format!("Bearer {}", c.admin_key)),
        body.as_bytes(),
    );
    assert!(
        status == 201 || status == 200,
        "{status} {}",
        String::from_utf8_lossy(&body)
    );
}

/// `GET /` of `port` of `id` through its URL on `conn`, with the admin key.
fn get_port(c: &Cluster, conn: &mut wire::Conn, id: &str, port: u16) -> wire::Answer {
    let host = format!("{port}-{id}.localhost:{}", edge(c).port());
    conn.get(
        &host,
        "/",
        &[("Authorization", &format!("Bearer {}", c.admin_key))],
    )
}

/// A `CONNECT {id}:9000` tunnel with the admin key, checked to echo.
fn echo_tunnel(c: &Cluster, id: &str) -> wire::Conn {
    let mut conn = wire::Conn::open(edge(c));
    let target = format!("{id}:9000");
    let auth = format!("Bearer {}", c.admin_key);
    let a = conn.request("CONNECT", &target, &target, &[("Authorization", &auth)]);
    assert_eq!(a.status, 200, "{a}");
    conn.write(b"ping through the guest\n");
    assert_eq!(conn.read_exact(23), b"ping through the guest\n");
    conn
}

#[test]
fn a_vm_sandbox_serves_its_loopback_ports_through_their_urls_and_a_migration_keeps_them() {
    let Some(c) = vm_cluster() else { return };
    let id = create_vm(&c);
    // Servers bound to the guest's own loopback (the guest has no other network):
    // busybox's httpd and a netcat that runs `cat` for every connection.
    sh(
        &c,
        &id,
        "mkdir -p /home/app/www && echo served by the guest > /home/app/www/index.html && \
         (busybox httpd -f -p 127.0.0.1:8000 -h /home/app/www >/dev/null 2>&1 </dev/null &) && \
         (busybox nc -ll -p 9000 -e /bin/cat >/dev/null 2>&1 </dev/null &)",
    );
    wait_until("the guest's servers", Duration::from_secs(20), || {
        let probe = "busybox wget -q -O - http://127.0.0.1:8000/ && \
                     busybox nc -w 1 127.0.0.1 9000 </dev/null";
        c.cli(&["exec", &id, "--", "sh", "-c", probe])
            .status
            .success()
            .then_some(())
    });
    expose(&c, &id, 8000, "http");
    expose(&c, &id, 9000, "tcp");
    expose(&c, &id, 8001, "http");

    // HTTP by host name: two requests on one client connection (busybox's httpd
    // closes after each answer, so the second is a new connection into the guest).
    let mut kept = wire::Conn::open(edge(&c));
    for _ in 0..2 {
        let a = get_port(&c, &mut kept, &id, 8000);
        assert_eq!(
            (a.status, a.text()),
            (200, "served by the guest\n".into()),
            "{a}"
        );
    }
    // An exposed port nothing listens on in the guest: the agent's refusal.
    let a = get_port(&c, &mut wire::Conn::open(edge(&c)), &id, 8001);
    assert_eq!((a.status, a.error()), (502, "port_closed".into()), "{a}");
    // A raw TCP tunnel.
    let mut tunnel = echo_tunnel(&c, &id);

    // Migrated to the other worker: connections to the old execution end, and the
    // same URLs reach the new one — whose servers are the same processes, their
    // memory kept (nothing started them again).
    let before = c.sandbox(&id)["execution"].clone();
    let target = if before["worker"] == "w1" { "w2" } else { "w1" };
    let out = c.cli(&["--json", "sandbox", "migrate", &id, "--worker", target]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    tunnel
        .ended_within(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("the old execution's tunnel: {e}"));
    let a = get_port(&c, &mut wire::Conn::open(edge(&c)), &id, 8000);
    assert_eq!(
        (a.status, a.text()),
        (200, "served by the guest\n".into()),
        "{a}"
    );
    echo_tunnel(&c, &id);
    let now = c.sandbox(&id)["execution"].clone();
    assert_eq!(now["worker"], target, "{now}");
}
