//! Launching, running commands in, and destroying jails.

use std::fs;
use std::os::unix::net::UnixStream;

use space_testkit::jail::{TestEnv, leftovers};
use space_testkit::require_jail_host;
use space_worker::substrate::jail::template::SYSTEM_DIRS;
use space_worker::substrate::{AgentCommand, Limits, Substrate, SubstrateError};

#[test]
fn a_launched_jail_runs_echo_through_its_agent_socket() {
    require_jail_host!();
    let env = TestEnv::new();
    let jail = env.jail();
    let reply = jail.sh("echo hello from the jail");
    assert_eq!(reply.exit_code, 0, "{reply:?}");
    assert_eq!(reply.stdout, "hello from the jail\n");
    // The usual tools of the host's /usr work inside.
    assert_eq!(jail.ok("python3 -c 'print(6 * 7)'"), "42\n");
}

#[test]
fn the_agent_reads_its_activation_from_fd_4() {
    require_jail_host!();
    let env = TestEnv::new();
    let jail = env.jail();
    let reply = jail.sh(space_jail::probe_agent::ACTIVATION_REQUEST);
    assert_eq!(reply.stdout, r#"{"execution":"test"}"#);
}

#[test]
fn the_handle_names_init_and_agent_by_pid_and_start_time() {
    require_jail_host!();
    let env = TestEnv::new();
    let jail = env.jail();
    let handle = &jail.handle;
    assert!(handle.init.is_alive());
    let agent = handle.agent.expect("agent identity");
    assert!(agent.is_alive());
    assert_ne!(agent.pid, handle.init.pid);
    let stat = space_worker::substrate::process::read_stat(agent.pid).unwrap();
    assert_eq!(stat.ppid, handle.init.pid, "the agent is the init's child");
    // The init was reparented to this process (child subreaper).
    let init_stat = space_worker::substrate::process::read_stat(handle.init.pid).unwrap();
    assert_eq!(init_stat.ppid, std::process::id() as i32);
    // Peer credentials of a connection name the agent, not the worker that bound.
    let stream = UnixStream::connect(&handle.socket_path).unwrap();
    let cred =
        nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials).unwrap();
    assert_eq!(cred.pid(), agent.pid);
}

#[test]
fn the_socket_dir_is_private_to_the_worker_and_outside_the_jail() {
    require_jail_host!();
    let env = TestEnv::new();
    let jail = env.jail();
    use std::os::unix::fs::PermissionsExt;
    let dir = jail.handle.socket_path.parent().unwrap();
    assert_eq!(
        fs::metadata(dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let found = jail.sh("find / -xdev -name agent.sock 2>/dev/null; ls /run");
    assert!(!found.stdout.contains("agent.sock"), "{found:?}");
}

#[test]
fn writes_land_in_the_upper_dir_and_the_template_stays_untouched() {
    require_jail_host!();
    let env = TestEnv::new();
    let jail = env.jail();
    jail.ok("echo layered > /root/note && mkdir -p /opt/app && echo x > /opt/app/y");
    let upper = &jail.handle.upper_dir;
    assert_eq!(
        fs::read_to_string(upper.join("root/note")).unwrap(),
        "layered\n"
    );
    assert!(upper.join("opt/app/y").exists());
    let template = env.data_dir().join("templates/default");
    assert!(!template.join("root/note").exists());
    assert!(!template.join("opt").exists());
    // The host's system dirs are read-only inside.
    let reply = jail.sh("touch /usr/bin/space-was-here");
    assert_ne!(reply.exit_code, 0);
    assert!(reply.stderr.contains("Read-only"), "{reply:?}");
    assert!(!std::path::Path::new("/usr/bin/space-was-here").exists());
    // /tmp is a private tmpfs: nothing lands in the layer.
    jail.ok("echo t > /tmp/scratch");
    assert!(!upper.join("tmp/scratch").exists());
}

#[test]
fn the_root_is_the_template_with_a_synthesized_etc_and_nothing_of_the_host() {
    require_jail_host!();
    let env = TestEnv::new();
    let jail = env.jail();
    let etc = jail.ok("ls -A /etc");
    assert!(etc.contains("passwd") && etc.contains("hosts"), "{etc}");
    assert!(!etc.contains("shadow"), "{etc}");
    assert!(!etc.contains("ssh"), "{etc}");
    // The platform's resolver, reached only with a network (issue 15).
    assert_eq!(
        jail.ok("cat /etc/resolv.conf"),
        "nameserver 169.254.169.253\n"
    );
    assert_eq!(
        jail.ok("id -un; getent passwd user | cut -d: -f6"),
        "root\n/home/user\n"
    );
    // Only the template's entries at the top level.
    let top: Vec<String> = jail.ok("ls -A /").lines().map(String::from).collect();
    let allowed = [
        "etc", "proc", "dev", "tmp", "root", "home", "run", "mnt", "var",
    ];
    for entry in &top {
        assert!(
            allowed.contains(&entry.as_str()) || SYSTEM_DIRS.contains(&entry.as_str()),
            "unexpected /{entry} in {top:?}"
        );
    }
    // The host's /root and the data dir are not reachable.
    assert_eq!(jail.ok("ls -A /root"), "");
    let data = env.data_dir();
    let reply = jail.sh(&format!("ls {}", data.display()));
    assert_ne!(reply.exit_code, 0, "data dir visible: {reply:?}");
    let home = jail.ok("ls -A /home");
    assert_eq!(home, "user\n");
}

#[test]
fn destroy_leaves_no_process_mount_cgroup_or_directory() {
    require_jail_host!();
    let env = TestEnv::new();
    let jail = env.jail();
    // Something long-running and a child of a child, to be sure all are killed.
    jail.ok("(sh -c 'sleep 1000' >/dev/null 2>&1 &) ; sleep 1000 >/dev/null 2>&1 &");
    let pids = jail.handle.cgroups.procs().unwrap();
    assert!(pids.len() >= 4, "init, agent and two sleeps: {pids:?}");
    let handle = jail.destroy();
    assert_eq!(leftovers(&handle), Vec::<String>::new());
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} survived"
        );
    }
    // Destroy is idempotent.
    env.driver.destroy(&handle).unwrap();
}

#[test]
fn a_failed_launch_reports_the_stage_and_leaves_nothing() {
    require_jail_host!();
    let env = TestEnv::new();
    let mut spec = env.spec(Limits::default());
    spec.agent = AgentCommand {
        path: "/nonexistent/agent".into(),
        args: vec![],
        env: vec![],
    };
    let err = env.driver.launch(&spec).map(|_| ()).unwrap_err();
    match &err {
        SubstrateError::Jail { stage, .. } => assert_eq!(stage, "open agent"),
        other => panic!("unexpected error {other}"),
    }
    let sandboxes = env.data_dir().join("sandboxes");
    assert_eq!(fs::read_dir(&sandboxes).unwrap().count(), 0);
    let cgroups = env
        .driver
        .hierarchy()
        .set_for("space", &spec.key.dir_name());
    assert!(!cgroups.exists());
}

#[test]
fn an_agent_that_exits_ends_the_jail_with_its_exit_code() {
    require_jail_host!();
    let env = TestEnv::new();
    let mut spec = env.spec(Limits::default());
    spec.agent = AgentCommand {
        path: "/bin/sh".into(),
        args: vec!["-c".into(), "echo from-sh; exit 7".into()],
        env: vec![],
    };
    let jail = env.launch(spec).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let code = loop {
        if let Some(code) = env.driver.try_wait(&jail.handle).unwrap() {
            break code;
        }
        assert!(std::time::Instant::now() < deadline, "agent did not exit");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    assert_eq!(code, 7);
    assert!(
        fs::read_to_string(&jail.handle.log_path)
            .unwrap()
            .contains("from-sh")
    );
    let handle = jail.destroy();
    assert_eq!(leftovers(&handle), Vec::<String>::new());
}

#[test]
fn sigterm_to_the_init_is_forwarded_to_the_agent() {
    require_jail_host!();
    let env = TestEnv::new();
    let mut spec = env.spec(Limits::default());
    spec.agent = AgentCommand {
        path: "/bin/sh".into(),
        args: vec![
            "-c".into(),
            "trap 'echo got-term; exit 3' TERM; echo armed; while :; do sleep 0.02; done".into(),
        ],
        env: vec![],
    };
    let jail = env.launch(spec).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // Wait until the trap is installed before signalling.
    while !fs::read_to_string(&jail.handle.log_path)
        .unwrap()
        .contains("armed")
    {
        assert!(std::time::Instant::now() < deadline, "agent never started");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(jail.handle.init.pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let code = loop {
        if let Some(code) = env.driver.try_wait(&jail.handle).unwrap() {
            break code;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the jail ignored SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    assert_eq!(code, 3, "the init exits with the agent's code");
    assert!(
        fs::read_to_string(&jail.handle.log_path)
            .unwrap()
            .contains("got-term")
    );
}
