//! Running processes through the real agent.

use std::time::{Duration, Instant};

use space_proto::client::ClientError;
use space_proto::guest::{AgentBody, ErrorKind, ExecSpec, ExitOutcome, Input, Operation, PtySize};
use space_testkit::agent::AgentProcess;

fn code(out: &space_proto::client::ExecOutput) -> ExitOutcome {
    out.status.outcome
}

#[test]
fn echo_prints_its_arguments() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let out = conn
        .exec(ExecSpec::command(["echo", "hello", "world"]))
        .unwrap();
    assert_eq!(out.stdout, b"hello world\n");
    assert_eq!(out.stderr, b"");
    assert_eq!(code(&out), ExitOutcome::Code(0));
    assert!(!out.status.timed_out);
}

#[test]
fn exit_code_and_stderr_are_reported() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let out = conn
        .exec(ExecSpec::shell("echo oops >&2; exit 42"))
        .unwrap();
    assert_eq!(out.stderr, b"oops\n");
    assert_eq!(code(&out), ExitOutcome::Code(42));
}

#[test]
fn a_process_killed_by_a_signal_reports_the_signal() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let out = conn.exec(ExecSpec::shell("kill -TERM $$")).unwrap();
    assert_eq!(code(&out), ExitOutcome::Signal(15));
}

#[test]
fn signal_input_reaches_the_process_group() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let id = conn
        .send_request(Operation::Exec(ExecSpec::command(["sleep", "30"])))
        .unwrap();
    assert!(matches!(
        conn.next_answer(id).unwrap(),
        AgentBody::Started { .. }
    ));
    conn.send_input(id, Input::Signal(2)).unwrap();
    let AgentBody::Exited(status) = conn.next_answer(id).unwrap() else {
        panic!("expected exit");
    };
    assert_eq!(status.outcome, ExitOutcome::Signal(2));
}

#[test]
fn a_real_time_signal_reaches_the_process_group_and_a_number_that_is_no_signal_is_ignored() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let id = conn
        .send_request(Operation::Exec(ExecSpec::command(["sleep", "30"])))
        .unwrap();
    assert!(matches!(
        conn.next_answer(id).unwrap(),
        AgentBody::Started { .. }
    ));
    // 0, 65 and -9 are no signals: the process runs on.
    for n in [0, 65, -9] {
        conn.send_input(id, Input::Signal(n)).unwrap();
    }
    // SIGRTMIN+5 (its default action ends the process).
    let rt = libc::SIGRTMIN() + 5;
    conn.send_input(id, Input::Signal(rt)).unwrap();
    let AgentBody::Exited(status) = conn.next_answer(id).unwrap() else {
        panic!("expected exit");
    };
    assert_eq!(status.outcome, ExitOutcome::Signal(rt));
}

#[test]
fn stdin_bytes_in_the_spec_reach_the_process_and_are_closed() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let mut spec = ExecSpec::command(["cat"]);
    spec.stdin = Some(b"from the spec".to_vec());
    let out = conn.exec(spec).unwrap();
    assert_eq!(out.stdout, b"from the spec");
}

#[test]
fn streamed_stdin_reaches_the_process_until_closed() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let mut spec = ExecSpec::command(["sh", "-c", "while read l; do echo got:$l; done; echo eof"]);
    spec.stdin = None;
    let id = conn.send_request(Operation::Exec(spec)).unwrap();
    assert!(matches!(
        conn.next_answer(id).unwrap(),
        AgentBody::Started { .. }
    ));
    conn.send_input(id, Input::Stdin(b"one\n".to_vec()))
        .unwrap();
    // Wait for the first answer before sending more: input and output interleave.
    let AgentBody::Stdout(first) = conn.next_answer(id).unwrap() else {
        panic!("expected output");
    };
    assert_eq!(first, b"got:one\n");
    conn.send_input(id, Input::Stdin(b"two\n".to_vec()))
        .unwrap();
    conn.send_input(id, Input::CloseStdin).unwrap();
    let mut rest = Vec::new();
    loop {
        match conn.next_answer(id).unwrap() {
            AgentBody::Stdout(c) => rest.extend(c),
            AgentBody::Exited(s) => {
                assert_eq!(s.outcome, ExitOutcome::Code(0));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(rest, b"got:two\neof\n");
}

#[test]
fn timeout_kills_the_process_group() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let marker = agent.path("grandchild-survived");
    // The background grandchild would write the marker after 2 s if it survived.
    let mut spec = ExecSpec::shell(&format!("(sleep 2; touch {marker}) & sleep 30"));
    spec.timeout_ms = Some(300);
    let start = Instant::now();
    let out = conn.exec(spec).unwrap();
    assert!(out.status.timed_out);
    assert_eq!(code(&out), ExitOutcome::Signal(9));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        !std::path::Path::new(&marker).exists(),
        "grandchild survived the timeout"
    );
}

#[test]
fn output_arrives_in_the_order_it_was_written() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let out = conn
        .exec(ExecSpec::shell(
            "for i in $(seq 1 2000); do echo line $i; done",
        ))
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let expected: String = (1..=2000).map(|i| format!("line {i}\n")).collect();
    assert_eq!(text, expected);
}

#[test]
fn output_is_streamed_before_the_process_ends() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let id = conn
        .send_request(Operation::Exec(ExecSpec::shell("echo early; sleep 30")))
        .unwrap();
    assert!(matches!(
        conn.next_answer(id).unwrap(),
        AgentBody::Started { .. }
    ));
    let start = Instant::now();
    assert_eq!(
        conn.next_answer(id).unwrap(),
        AgentBody::Stdout(b"early\n".to_vec())
    );
    assert!(start.elapsed() < Duration::from_secs(10));
    conn.send_input(id, Input::Signal(9)).unwrap();
    assert!(matches!(
        conn.next_answer(id).unwrap(),
        AgentBody::Exited(_)
    ));
}

#[test]
fn default_environment_is_minimal_and_cwd_is_home() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let out = conn.exec(ExecSpec::command(["env"])).unwrap();
    let mut vars: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split('=').next().unwrap().to_owned())
        .collect();
    vars.sort();
    assert_eq!(vars, ["HOME", "LANG", "PATH"]);
    let out = conn
        .exec(ExecSpec::shell("pwd; echo $HOME; echo $LANG"))
        .unwrap();
    let home = agent.home_path().to_string_lossy().into_owned();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("{home}\n{home}\nC.UTF-8\n")
    );
}

#[test]
fn env_and_cwd_of_the_spec_apply() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let mut spec = ExecSpec::shell("echo $GREETING; pwd");
    spec.env = vec![("GREETING".into(), "hi".into())];
    spec.cwd = Some("/tmp".into());
    let out = conn.exec(spec).unwrap();
    assert_eq!(out.stdout, b"hi\n/tmp\n");
}

#[test]
fn missing_program_is_not_found_and_the_connection_stays_usable() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    // Answered as a shell does: exit 127 and a message on stderr, for a path and for a
    // name looked up in PATH; 126 for a file that is not executable.
    for program in ["/no/such/program", "no-such-program"] {
        let out = conn.exec(ExecSpec::command([program])).unwrap();
        assert_eq!(code(&out), ExitOutcome::Code(127), "{program}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            format!("space: {program}: command not found\n")
        );
    }
    let plain = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(plain.path(), "#!/bin/sh\necho ran\n").unwrap();
    let path = plain.path().to_str().unwrap();
    let out = conn.exec(ExecSpec::command([path])).unwrap();
    assert_eq!(code(&out), ExitOutcome::Code(126));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("space: {path}: permission denied\n")
    );
    let err = conn
        .exec(ExecSpec::command(Vec::<String>::new()))
        .unwrap_err();
    assert!(
        matches!(err, ClientError::Agent(ref e) if e.kind == ErrorKind::InvalidArgument),
        "{err:?}"
    );
    assert_eq!(
        conn.exec(ExecSpec::command(["true"]))
            .unwrap()
            .status
            .outcome,
        ExitOutcome::Code(0)
    );
}

#[test]
fn children_inherit_no_agent_descriptor() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    // Only stdin, stdout, stderr and the descriptor ls opens for the listing: not the
    // agent's listener, nor its connections, nor what the agent itself inherited.
    let out = conn
        .exec(ExecSpec::shell("ls /proc/self/fd | wc -l"))
        .unwrap();
    let n: u32 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(n <= 4, "child sees {n} descriptors");
}

#[test]
fn tty_under_a_pty_prints_a_dev_pts_path() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let mut spec = ExecSpec::command(["tty"]);
    spec.pty = Some(PtySize { rows: 24, cols: 80 });
    let out = conn.exec(spec).unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("/dev/pts/"), "{text:?}");
    assert_eq!(out.status.outcome, ExitOutcome::Code(0));
    // Without a PTY, stdin is a pipe.
    let out = conn.exec(ExecSpec::command(["tty"])).unwrap();
    assert_eq!(out.stdout, b"not a tty\n");
}

#[test]
fn pty_has_the_requested_size_and_term() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let mut spec = ExecSpec::shell("stty size; echo $TERM");
    spec.pty = Some(PtySize {
        rows: 33,
        cols: 101,
    });
    let out = conn.exec(spec).unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "33 101\r\nxterm-256color\r\n"
    );
}

#[test]
fn resize_is_seen_by_stty_size() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let mut spec = ExecSpec::shell("stty -echo; echo ready; read x; stty size");
    spec.pty = Some(PtySize { rows: 24, cols: 80 });
    spec.stdin = None;
    let id = conn.send_request(Operation::Exec(spec)).unwrap();
    assert!(matches!(
        conn.next_answer(id).unwrap(),
        AgentBody::Started { .. }
    ));
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("ready") {
        match conn.next_answer(id).unwrap() {
            AgentBody::Stdout(c) => seen.extend(c),
            other => panic!("unexpected {other:?}"),
        }
    }
    conn.send_input(
        id,
        Input::Resize(PtySize {
            rows: 50,
            cols: 132,
        }),
    )
    .unwrap();
    conn.send_input(id, Input::Stdin(b"\n".to_vec())).unwrap();
    let mut rest = Vec::new();
    loop {
        match conn.next_answer(id).unwrap() {
            AgentBody::Stdout(c) => rest.extend(c),
            AgentBody::Exited(_) => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        String::from_utf8_lossy(&rest).contains("50 132"),
        "{:?}",
        String::from_utf8_lossy(&rest)
    );
}

#[test]
fn dropping_the_connection_kills_the_running_process() {
    let agent = AgentProcess::start();
    let marker = agent.path("survived");
    {
        let mut conn = agent.connect();
        let id = conn
            .send_request(Operation::Exec(ExecSpec::shell(&format!(
                "sleep 1; touch {marker}"
            ))))
            .unwrap();
        assert!(matches!(
            conn.next_answer(id).unwrap(),
            AgentBody::Started { .. }
        ));
    }
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !std::path::Path::new(&marker).exists(),
        "process outlived its connection"
    );
}

/// Bytes of `bytes` in the exec answer's JSON string (without quotes).
fn json_len(bytes: &[u8]) -> usize {
    space_proto::guest::json_str_len(&String::from_utf8_lossy(bytes))
}

/// Peak RSS of a process, KiB.
fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

/// Runs `spec` and collects the agent's frames as sent (no collector-side cap).
fn raw_exec(
    conn: &mut space_proto::client::AgentConnection,
    spec: ExecSpec,
) -> (Vec<u8>, Vec<u8>, space_proto::guest::ExitStatus) {
    let id = conn.send_request(Operation::Exec(spec)).unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    loop {
        match conn.next_answer(id).unwrap() {
            AgentBody::Started { .. } => {}
            AgentBody::Stdout(c) => out.extend(c),
            AgentBody::Stderr(c) => err.extend(c),
            AgentBody::Exited(s) => return (out, err, s),
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn capped_exec_output_flood_stops_at_the_cap_and_says_truncated() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let cap: u64 = 1 << 20;
    let peak_before = vm_hwm_kib(agent.pid());
    // 100 MB of NULs on stdout, 50 MB of `yes` on stderr: the process must run to its
    // end (the agent drains its pipes past the cap) and exit 7.
    let mut spec =
        ExecSpec::shell("head -c 100000000 /dev/zero; yes | head -c 50000000 >&2; exit 7");
    spec.max_output_bytes = Some(cap);
    spec.timeout_ms = Some(60_000);
    let (out, err, status) = raw_exec(&mut conn, spec);
    assert_eq!(status.outcome, ExitOutcome::Code(7), "{status:?}");
    assert!(!status.timed_out);
    assert!(
        status.stdout_truncated && status.stderr_truncated,
        "{status:?}"
    );
    // A NUL is `\u0000` in the answer: six bytes of the cap each.
    assert_eq!(out.len() as u64, cap / 6);
    assert!(out.iter().all(|&b| b == 0));
    let n = json_len(&err) as u64;
    assert!(
        n <= cap && n + 3 > cap,
        "stderr encodes to {n} for a cap of {cap}"
    );
    assert!(err.starts_with(b"y\ny\n"));
    let grown = vm_hwm_kib(agent.pid()).saturating_sub(peak_before);
    assert!(grown < 8 << 10, "agent peak RSS grew {grown} KiB");
}

#[test]
fn capped_exec_output_under_the_cap_is_whole_and_not_truncated() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    // Text with multi-byte characters, an escape-heavy tail and invalid bytes that
    // straddle read boundaries: exactly what fits is what the answer holds.
    let script =
        "for i in $(seq 1 3000); do printf 'héllo €%s\\t\"\\n' $i; done; printf '\\377\\342\\202'";
    let mut spec = ExecSpec::shell(script);
    spec.max_output_bytes = Some(u64::MAX);
    let (whole, _, _) = raw_exec(&mut conn, spec.clone());
    let exact = json_len(&whole) as u64;
    spec.max_output_bytes = Some(exact);
    let out = conn.exec(spec.clone()).unwrap();
    assert_eq!(out.stdout, whole);
    assert!(!out.status.stdout_truncated && !out.status.stderr_truncated);
    spec.max_output_bytes = Some(exact - 1);
    let out = conn.exec(spec).unwrap();
    assert!(out.status.stdout_truncated);
    assert!(whole.starts_with(&out.stdout));
    assert!((json_len(&out.stdout) as u64) < exact);
}

#[test]
fn a_capped_flood_that_times_out_says_both() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let mut spec = ExecSpec::command(["yes"]);
    spec.max_output_bytes = Some(4096);
    spec.timeout_ms = Some(500);
    let out = conn.exec(spec).unwrap();
    assert!(out.status.timed_out);
    assert!(out.status.stdout_truncated);
    assert_eq!(out.status.outcome, ExitOutcome::Signal(9));
    assert!(json_len(&out.stdout) <= 4096);
}

#[test]
fn a_process_run_as_a_uid_has_that_uid_its_own_group_and_root_as_home() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: switching accounts needs root");
        return;
    }
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let mut spec = ExecSpec::shell("id -u; id -g; id -G; echo \"$HOME $USER\"; pwd");
    // A uid no passwd names: group = uid, home `/`.
    spec.user = Some(space_proto::guest::Account::Uid(4_000_123));
    let out = conn.exec(spec).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "4000123\n4000123\n4000123\n/ 4000123\n/\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn an_unknown_user_is_refused_and_nothing_runs() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let marker = agent.path("ran");
    let mut spec = ExecSpec::shell(&format!("touch {marker}"));
    spec.user = Some(space_proto::guest::Account::Name(
        "no-such-user-here".into(),
    ));
    let err = conn.exec(spec).unwrap_err();
    match err {
        ClientError::Agent(e) => assert_eq!(e.kind, ErrorKind::UnknownUser, "{e}"),
        other => panic!("{other}"),
    }
    assert!(!std::path::Path::new(&marker).exists());
    // The connection is still in step.
    let out = conn.exec(ExecSpec::command(["true"])).unwrap();
    assert_eq!(code(&out), ExitOutcome::Code(0));
}
