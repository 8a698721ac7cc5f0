//! File operations and watches through the real agent.

use std::time::Duration;

use space_proto::client::{AgentConnection, ClientError};
use space_proto::guest::{
    AgentBody, ErrorKind, ExecSpec, FileKind, Input, Operation, WatchEndReason, WatchEvent,
};
use space_testkit::agent::AgentProcess;

fn agent_error(err: ClientError) -> ErrorKind {
    match err {
        ClientError::Agent(e) => e.kind,
        other => panic!("expected an agent error, got {other:?}"),
    }
}

#[test]
fn write_then_read_a_file() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(
        conn.write_file("data.bin", &data, None).unwrap(),
        data.len() as u64
    );
    assert_eq!(conn.read_file("data.bin", u64::MAX).unwrap(), data);
    assert_eq!(std::fs::read(agent.home.join("data.bin")).unwrap(), data);
    // The same file by absolute path.
    assert_eq!(
        conn.read_file(&agent.path("data.bin"), 10).unwrap(),
        &data[..10]
    );
}

#[test]
fn read_stops_at_max_bytes_and_says_so() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    std::fs::write(agent.home.join("f"), b"0123456789").unwrap();
    let id = conn
        .send_request(Operation::ReadFile {
            path: "f".into(),
            offset: 2,
            max_bytes: 5,
        })
        .unwrap();
    assert_eq!(
        conn.next_answer(id).unwrap(),
        AgentBody::FileData(b"23456".to_vec())
    );
    assert_eq!(
        conn.next_answer(id).unwrap(),
        AgentBody::ReadEnd {
            bytes: 5,
            truncated: true
        }
    );
    let whole = conn.read_file("f", 10).unwrap();
    assert_eq!(whole, b"0123456789");
}

#[test]
fn atomic_write_leaves_no_temporary_file_and_keeps_the_mode() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    conn.write_file("script.sh", b"#!/bin/sh\necho v1\n", Some(0o755))
        .unwrap();
    conn.write_file("script.sh", b"#!/bin/sh\necho v2\n", None)
        .unwrap();
    let names: Vec<String> = conn
        .list(".")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["script.sh"]);
    let stat = conn.stat("script.sh").unwrap();
    assert_eq!(stat.mode, 0o755);
    let out = conn.exec(ExecSpec::command(["./script.sh"])).unwrap();
    assert_eq!(out.stdout, b"v2\n");
}

#[test]
fn failed_write_leaves_the_old_content_and_no_temporary_file() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    conn.mkdir("d", false).unwrap();
    let err = conn.write_file("d", b"x", None).unwrap_err();
    assert_eq!(agent_error(err), ErrorKind::IsADirectory);
    let err = conn.write_file("missing/f", b"x", None).unwrap_err();
    assert_eq!(agent_error(err), ErrorKind::NotFound);
    let names: Vec<String> = conn
        .list(".")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["d"]);
    // The connection is still in step after the refused writes.
    assert_eq!(conn.stat("d").unwrap().kind, FileKind::Dir);
}

#[test]
fn write_with_parents_creates_the_directories() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let id = conn
        .send_request(Operation::WriteFile {
            path: "a/b/c.txt".into(),
            mode: None,
            parents: true,
            user: None,
        })
        .unwrap();
    conn.send_input(id, Input::Data(b"deep".to_vec())).unwrap();
    conn.send_input(id, Input::End).unwrap();
    assert_eq!(
        conn.next_answer(id).unwrap(),
        AgentBody::Written { bytes: 4 }
    );
    assert_eq!(conn.read_file("a/b/c.txt", 100).unwrap(), b"deep");
}

#[test]
fn list_stat_mkdir_remove_and_rename() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    assert!(conn.mkdir("x/y/z", true).unwrap());
    assert!(!conn.mkdir("x/y/z", true).unwrap());
    assert_eq!(
        agent_error(conn.mkdir("x", false).unwrap_err()),
        ErrorKind::AlreadyExists
    );
    assert_eq!(
        agent_error(conn.mkdir("p/q", false).unwrap_err()),
        ErrorKind::NotFound
    );
    conn.write_file("x/file", b"12345", None).unwrap();
    std::os::unix::fs::symlink("file", agent.home.join("x/link")).unwrap();

    let mut entries = conn.list("x").unwrap();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let summary: Vec<(&str, FileKind, u64)> = entries
        .iter()
        .map(|e| {
            (
                e.name.as_str(),
                e.kind,
                if e.kind == FileKind::File { e.size } else { 0 },
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("file", FileKind::File, 5),
            ("link", FileKind::Symlink, 0),
            ("y", FileKind::Dir, 0)
        ]
    );
    let link = conn.stat("x/link").unwrap();
    assert_eq!(link.kind, FileKind::Symlink);
    assert_eq!(link.symlink_target.as_deref(), Some("file"));
    assert_eq!(conn.stat("x/file").unwrap().size, 5);
    assert_eq!(
        agent_error(conn.stat("nope").unwrap_err()),
        ErrorKind::NotFound
    );
    assert_eq!(
        agent_error(conn.list("x/file").unwrap_err()),
        ErrorKind::NotADirectory
    );
    assert_eq!(
        agent_error(conn.read_file("x", 10).unwrap_err()),
        ErrorKind::IsADirectory
    );

    conn.rename("x/file", "x/renamed").unwrap();
    assert_eq!(conn.read_file("x/renamed", 10).unwrap(), b"12345");
    assert_eq!(
        agent_error(conn.stat("x/file").unwrap_err()),
        ErrorKind::NotFound
    );

    assert_eq!(
        agent_error(conn.remove("x", false).unwrap_err()),
        ErrorKind::Io
    );
    conn.remove("x/renamed", false).unwrap();
    conn.remove("x", true).unwrap();
    assert!(conn.list(".").unwrap().is_empty());
    assert_eq!(
        agent_error(conn.remove("x", true).unwrap_err()),
        ErrorKind::NotFound
    );
}

#[test]
fn mkdir_says_whether_it_made_the_directory_and_refuses_a_file_in_the_way() {
    use std::os::unix::fs::PermissionsExt;
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    assert!(conn.mkdir("new/deep", true).unwrap());
    for d in ["new", "new/deep"] {
        let mode = std::fs::metadata(agent.home.join(d))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o755, "{d}");
    }
    assert!(!conn.mkdir("new/deep", true).unwrap());
    // A symlink to a directory is a directory already there.
    std::os::unix::fs::symlink("new", agent.home.join("to-new")).unwrap();
    assert!(!conn.mkdir("to-new", true).unwrap());
    std::fs::write(agent.home.join("file"), b"x").unwrap();
    assert_eq!(
        agent_error(conn.mkdir("file", true).unwrap_err()),
        ErrorKind::AlreadyExists
    );
    assert_eq!(
        agent_error(conn.mkdir("file/below", true).unwrap_err()),
        ErrorKind::NotADirectory
    );
    assert_eq!(std::fs::read(agent.home.join("file")).unwrap(), b"x");
}

#[test]
fn stat_and_list_name_owners_groups_and_times_and_describe_links_without_following_them() {
    use std::os::unix::fs::MetadataExt;
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    std::fs::create_dir(agent.home.join("d")).unwrap();
    std::fs::write(agent.home.join("d/f"), b"hello").unwrap();
    std::os::unix::fs::symlink("/nowhere/at/all", agent.home.join("d/dangling")).unwrap();
    let md = std::fs::metadata(agent.home.join("d/f")).unwrap();

    let f = conn.stat("d/f").unwrap();
    assert_eq!(f.path, agent.path("d/f"));
    assert_eq!((f.kind, f.size), (FileKind::File, 5));
    assert_eq!((f.uid, f.gid), (md.uid(), md.gid()));
    assert_eq!(
        (f.modified_secs, i64::from(f.modified_nanos)),
        (md.mtime(), md.mtime_nsec())
    );
    if md.uid() == 0 {
        // The host's own /etc/passwd and /etc/group name root (the agent here is not
        // in a jail: it reads the files of the root it runs in).
        assert_eq!((f.owner.as_str(), f.group.as_str()), ("root", "root"));
    }
    let link = conn.stat(&agent.path("d/dangling")).unwrap();
    assert_eq!(link.kind, FileKind::Symlink);
    assert_eq!(link.symlink_target.as_deref(), Some("/nowhere/at/all"));

    let mut entries = conn.list("d").unwrap();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(entries.len(), 2);
    let (dangling, file) = (&entries[0], &entries[1]);
    assert_eq!(dangling.kind, FileKind::Symlink);
    assert_eq!(dangling.symlink_target.as_deref(), Some("/nowhere/at/all"));
    assert_eq!(file.symlink_target, None);
    assert_eq!(
        (file.mode, file.uid, file.gid, &file.owner, &file.group),
        (f.mode, f.uid, f.gid, &f.owner, &f.group)
    );
    assert_eq!(
        (file.modified_secs, file.modified_nanos),
        (f.modified_secs, f.modified_nanos)
    );
}

#[test]
fn a_listing_of_links_with_long_targets_stays_under_the_frame_cap() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    // 256 links with 4000-byte targets: about 1 MiB of targets in one directory.
    let target = format!("/{}", "t".repeat(3999));
    for i in 0..256 {
        std::os::unix::fs::symlink(&target, agent.home.join(format!("l{i:03}"))).unwrap();
    }
    let entries = conn.list(".").unwrap();
    assert_eq!(entries.len(), 256);
    assert!(
        entries
            .iter()
            .all(|e| e.symlink_target.as_deref() == Some(target.as_str()))
    );
}

#[test]
fn list_of_a_large_directory_arrives_in_several_batches() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    for i in 0..1000 {
        std::fs::write(agent.home.join(format!("f{i:04}")), b"").unwrap();
    }
    let id = conn
        .send_request(Operation::List { path: ".".into() })
        .unwrap();
    let (mut batches, mut names) = (0, Vec::new());
    loop {
        match conn.next_answer(id).unwrap() {
            AgentBody::Entries(b) => {
                batches += 1;
                names.extend(b.into_iter().map(|e| e.name));
            }
            AgentBody::Done => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    names.sort();
    assert!(batches >= 4, "{batches}");
    assert_eq!(
        names,
        (0..1000).map(|i| format!("f{i:04}")).collect::<Vec<_>>()
    );
}

fn next_event(conn: &mut AgentConnection, id: u64) -> WatchEvent {
    match conn.next_answer(id).unwrap() {
        AgentBody::WatchEvent(e) => e,
        other => panic!("expected a watch event, got {other:?}"),
    }
}

#[test]
fn watch_sees_a_file_created_by_an_exec() {
    let agent = AgentProcess::start();
    std::fs::create_dir(agent.home.join("w")).unwrap();
    let mut watch = agent.connect();
    watch
        .stream_mut()
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let id = watch
        .send_request(Operation::Watch {
            path: "w".into(),
            recursive: false,
        })
        .unwrap();
    assert_eq!(watch.next_answer(id).unwrap(), AgentBody::WatchStarted);

    let mut exec = agent.connect();
    exec.exec(ExecSpec::shell("echo hi > w/new.txt")).unwrap();
    assert_eq!(
        next_event(&mut watch, id),
        WatchEvent::Created {
            path: "new.txt".into(),
            dir: false
        }
    );
    assert_eq!(
        next_event(&mut watch, id),
        WatchEvent::Modified {
            path: "new.txt".into()
        }
    );

    exec.rename(&agent.path("w/new.txt"), &agent.path("w/moved.txt"))
        .unwrap();
    assert_eq!(
        next_event(&mut watch, id),
        WatchEvent::Renamed {
            from: "new.txt".into(),
            to: "moved.txt".into()
        }
    );
    exec.remove(&agent.path("w/moved.txt"), false).unwrap();
    assert_eq!(
        next_event(&mut watch, id),
        WatchEvent::Removed {
            path: "moved.txt".into(),
            dir: false
        }
    );
    watch.send_input(id, Input::Close).unwrap();
    assert_eq!(
        watch.next_answer(id).unwrap(),
        AgentBody::WatchEnded {
            reason: WatchEndReason::Closed
        }
    );
    // The connection serves requests again after the watch.
    assert_eq!(watch.stat("w").unwrap().kind, FileKind::Dir);
}

#[test]
fn recursive_watch_follows_new_subdirectories() {
    let agent = AgentProcess::start();
    std::fs::create_dir_all(agent.home.join("r/old")).unwrap();
    let mut watch = agent.connect();
    watch
        .stream_mut()
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let id = watch
        .send_request(Operation::Watch {
            path: "r".into(),
            recursive: true,
        })
        .unwrap();
    assert_eq!(watch.next_answer(id).unwrap(), AgentBody::WatchStarted);
    let mut exec = agent.connect();
    exec.exec(ExecSpec::shell("touch r/old/a")).unwrap();
    assert_eq!(
        next_event(&mut watch, id),
        WatchEvent::Created {
            path: "old/a".into(),
            dir: false
        }
    );
    exec.mkdir(&agent.path("r/new"), false).unwrap();
    assert_eq!(
        next_event(&mut watch, id),
        WatchEvent::Created {
            path: "new".into(),
            dir: true
        }
    );
    exec.exec(ExecSpec::shell("touch r/new/b")).unwrap();
    assert_eq!(
        next_event(&mut watch, id),
        WatchEvent::Created {
            path: "new/b".into(),
            dir: false
        }
    );
    exec.remove(&agent.path("r"), true).unwrap();
    // Removal events for the contents, then the end of the watch.
    loop {
        match watch.next_answer(id).unwrap() {
            AgentBody::WatchEvent(WatchEvent::Removed { .. }) => {}
            AgentBody::WatchEnded { reason } => {
                assert_eq!(reason, WatchEndReason::RootGone);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn watch_of_a_missing_directory_is_not_found() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let id = conn
        .send_request(Operation::Watch {
            path: "absent".into(),
            recursive: false,
        })
        .unwrap();
    assert_eq!(
        agent_error(conn.next_answer(id).unwrap_err()),
        ErrorKind::NotFound
    );
}

#[test]
fn removing_a_very_deep_tree_succeeds_and_the_agent_keeps_serving() {
    let mut agent = AgentProcess::start();
    let mut conn = agent.connect();
    // 2000 levels: near PATH_MAX, far deeper than a recursive removal should need.
    let out = conn
        .exec(ExecSpec::shell(
            "mkdir deep && cd deep && i=0; while [ $i -lt 2000 ]; do mkdir d && cd d && touch f; i=$((i+1)); done",
        ))
        .unwrap();
    assert_eq!(
        out.status.outcome,
        space_proto::guest::ExitOutcome::Code(0),
        "{:?}",
        out
    );
    conn.remove("deep", true).unwrap();
    assert!(agent.is_running());
    assert!(conn.list(".").unwrap().is_empty());
}

#[test]
fn entries_moved_out_of_and_into_the_watched_directory_are_removed_and_created() {
    let agent = AgentProcess::start();
    std::fs::create_dir(agent.home.join("w")).unwrap();
    std::fs::write(agent.home.join("w/leaving"), b"").unwrap();
    std::fs::write(agent.home.join("arriving"), b"").unwrap();
    let mut watch = agent.connect();
    watch
        .stream_mut()
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let id = watch
        .send_request(Operation::Watch {
            path: "w".into(),
            recursive: false,
        })
        .unwrap();
    assert_eq!(watch.next_answer(id).unwrap(), AgentBody::WatchStarted);
    let mut other = agent.connect();
    other.rename("w/leaving", "left").unwrap();
    assert_eq!(
        next_event(&mut watch, id),
        WatchEvent::Removed {
            path: "leaving".into(),
            dir: false
        }
    );
    other.rename("arriving", "w/arrived").unwrap();
    assert_eq!(
        next_event(&mut watch, id),
        WatchEvent::Created {
            path: "arrived".into(),
            dir: false
        }
    );
}
