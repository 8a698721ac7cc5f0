//! Property tests of the message codec: round trips, and strictness on every prefix and
//! every extension of a valid encoding.

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use space_identity::{ExecutionId, Generation, SandboxId};

use super::*;
use crate::codec::{self, DecodeError};
use crate::frame::{self, FrameReader};

fn text() -> impl Strategy<Value = String> {
    "[a-z/._ é-]{0,24}"
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..300)
}

fn pty() -> impl Strategy<Value = PtySize> {
    (any::<u16>(), any::<u16>()).prop_map(|(rows, cols)| PtySize { rows, cols })
}

fn account() -> impl Strategy<Value = Account> {
    prop_oneof![
        text().prop_map(Account::Name),
        any::<u32>().prop_map(Account::Uid)
    ]
}

fn operation() -> impl Strategy<Value = Operation> {
    let exec = (
        vec(text(), 0..4),
        vec((text(), text()), 0..3),
        option::of(text()),
        option::of(bytes()),
        option::of(any::<u64>()),
        option::of(pty()),
        option::of(any::<u64>()),
        option::of(account()),
    )
        .prop_map(
            |(argv, env, cwd, stdin, timeout_ms, pty, max_output_bytes, user)| {
                Operation::Exec(ExecSpec {
                    argv,
                    env,
                    cwd,
                    stdin,
                    timeout_ms,
                    pty,
                    max_output_bytes,
                    user,
                })
            },
        );
    prop_oneof![
        exec,
        (text(), any::<u64>(), any::<u64>()).prop_map(|(path, offset, max_bytes)| {
            Operation::ReadFile {
                path,
                offset,
                max_bytes,
            }
        }),
        (
            text(),
            option::of(any::<u32>()),
            any::<bool>(),
            option::of(account())
        )
            .prop_map(|(path, mode, parents, user)| Operation::WriteFile {
                path,
                mode,
                parents,
                user,
            }),
        text().prop_map(|path| Operation::ReadTree { path }),
        (text(), option::of(account()))
            .prop_map(|(path, user)| Operation::WriteTree { path, user }),
        text().prop_map(|path| Operation::List { path }),
        text().prop_map(|path| Operation::Stat { path }),
        (text(), any::<bool>(), option::of(account())).prop_map(|(path, parents, user)| {
            Operation::Mkdir {
                path,
                parents,
                user,
            }
        }),
        (text(), any::<bool>()).prop_map(|(path, recursive)| Operation::Remove { path, recursive }),
        (text(), text(), option::of(account())).prop_map(|(from, to, user)| Operation::Rename {
            from,
            to,
            user
        }),
        (text(), any::<bool>()).prop_map(|(path, recursive)| Operation::Watch { path, recursive }),
        (account(), text()).prop_map(|(user, path)| Operation::AsUser {
            user,
            op: Box::new(Operation::Stat { path })
        }),
        any::<u16>().prop_map(|port| Operation::ConnectPort { port }),
    ]
}

fn input() -> impl Strategy<Value = Input> {
    prop_oneof![
        bytes().prop_map(Input::Stdin),
        Just(Input::CloseStdin),
        pty().prop_map(Input::Resize),
        any::<i32>().prop_map(Input::Signal),
        bytes().prop_map(Input::Data),
        Just(Input::End),
        Just(Input::Close),
    ]
}

fn client_frame() -> impl Strategy<Value = ClientFrame> {
    prop_oneof![
        (any::<u32>(), any::<[u8; 32]>()).prop_map(|(protocol_version, nonce)| {
            ClientFrame::Hello(Hello {
                protocol_version,
                nonce,
            })
        }),
        (any::<u64>(), operation()).prop_map(|(id, op)| ClientFrame::Request(Request { id, op })),
        (any::<u64>(), input())
            .prop_map(|(id, input)| ClientFrame::Input(InputFrame { id, input })),
    ]
}

fn error_kind() -> impl Strategy<Value = ErrorKind> {
    prop_oneof![
        Just(ErrorKind::NotFound),
        Just(ErrorKind::PermissionDenied),
        Just(ErrorKind::IsADirectory),
        Just(ErrorKind::NotADirectory),
        Just(ErrorKind::AlreadyExists),
        Just(ErrorKind::InvalidArgument),
        Just(ErrorKind::Io),
        Just(ErrorKind::UnsupportedVersion),
        Just(ErrorKind::Protocol),
        Just(ErrorKind::Busy),
        Just(ErrorKind::NoSpace),
        Just(ErrorKind::UnknownUser),
        Just(ErrorKind::PortClosed),
    ]
}

fn file_kind() -> impl Strategy<Value = FileKind> {
    prop_oneof![
        Just(FileKind::File),
        Just(FileKind::Dir),
        Just(FileKind::Symlink),
        Just(FileKind::Other),
    ]
}

fn watch_event() -> impl Strategy<Value = WatchEvent> {
    prop_oneof![
        (text(), any::<bool>()).prop_map(|(path, dir)| WatchEvent::Created { path, dir }),
        text().prop_map(|path| WatchEvent::Modified { path }),
        (text(), any::<bool>()).prop_map(|(path, dir)| WatchEvent::Removed { path, dir }),
        (text(), text()).prop_map(|(from, to)| WatchEvent::Renamed { from, to }),
        Just(WatchEvent::Overflow),
    ]
}

fn agent_body() -> impl Strategy<Value = AgentBody> {
    let ack = (
        any::<[u8; 16]>(),
        any::<u64>(),
        any::<[u8; 16]>(),
        any::<u32>(),
        any::<[u8; 32]>(),
    )
        .prop_map(|(s, generation, e, activation, proof)| {
            AgentBody::HelloAck(HelloAck {
                protocol_version: PROTOCOL_VERSION,
                sandbox: SandboxId::from_bytes(s),
                generation: Generation(generation),
                execution_id: ExecutionId::from_bytes(e),
                activation,
                proof,
            })
        });
    let exited = (
        prop_oneof![
            any::<i32>().prop_map(ExitOutcome::Code),
            any::<i32>().prop_map(ExitOutcome::Signal)
        ],
        any::<bool>(),
        any::<(bool, bool)>(),
    )
        .prop_map(
            |(outcome, timed_out, (stdout_truncated, stderr_truncated))| {
                AgentBody::Exited(ExitStatus {
                    outcome,
                    timed_out,
                    stdout_truncated,
                    stderr_truncated,
                })
            },
        );
    let stat = (
        text(),
        file_kind(),
        any::<u64>(),
        owner(),
        modified(),
        option::of(text()),
    )
        .prop_map(
            |(path, kind, size, (mode, uid, gid, owner, group), (secs, nanos), target)| {
                AgentBody::Stat(Box::new(FileStat {
                    path,
                    kind,
                    size,
                    mode,
                    uid,
                    gid,
                    owner,
                    group,
                    modified_secs: secs,
                    modified_nanos: nanos,
                    symlink_target: target,
                }))
            },
        );
    let entry = (
        text(),
        file_kind(),
        any::<u64>(),
        owner(),
        modified(),
        option::of(text()),
    )
        .prop_map(
            |(name, kind, size, (mode, uid, gid, owner, group), (secs, nanos), target)| DirEntry {
                name,
                kind,
                size,
                mode,
                uid,
                gid,
                owner,
                group,
                modified_secs: secs,
                modified_nanos: nanos,
                symlink_target: target,
            },
        );
    prop_oneof![
        ack,
        (error_kind(), text()).prop_map(|(k, m)| AgentBody::Error(WireError::new(k, m))),
        any::<u32>().prop_map(|pid| AgentBody::Started { pid }),
        bytes().prop_map(AgentBody::Stdout),
        bytes().prop_map(AgentBody::Stderr),
        exited,
        bytes().prop_map(AgentBody::FileData),
        (any::<u64>(), any::<bool>())
            .prop_map(|(bytes, truncated)| AgentBody::ReadEnd { bytes, truncated }),
        any::<u64>().prop_map(|bytes| AgentBody::Written { bytes }),
        vec(entry, 0..5).prop_map(AgentBody::Entries),
        stat,
        Just(AgentBody::Done),
        Just(AgentBody::WatchStarted),
        watch_event().prop_map(AgentBody::WatchEvent),
        prop_oneof![Just(WatchEndReason::Closed), Just(WatchEndReason::RootGone)]
            .prop_map(|reason| AgentBody::WatchEnded { reason }),
        (any::<u64>(), option::of(any::<(u64, u64)>()))
            .prop_map(|(size, range)| AgentBody::FileOpened { size, range }),
        any::<bool>().prop_map(|created| AgentBody::Made { created }),
        Just(AgentBody::PortConnected),
    ]
}

/// Mode, uid, gid and the owner's and group's names of a file.
fn owner() -> impl Strategy<Value = (u32, u32, u32, String, String)> {
    (any::<u32>(), any::<u32>(), any::<u32>(), text(), text())
}

/// A modification time: seconds (before the epoch too) and nanoseconds.
fn modified() -> impl Strategy<Value = (i64, u32)> {
    (any::<i64>(), any::<u32>())
}

fn agent_frame() -> impl Strategy<Value = AgentFrame> {
    (any::<[u8; 16]>(), any::<u64>(), agent_body()).prop_map(|(e, request_id, body)| AgentFrame {
        execution_id: ExecutionId::from_bytes(e),
        request_id,
        body,
    })
}

/// Every proper prefix and every one-byte extension of `bytes` must be refused.
fn assert_strict<T: serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug>(
    bytes: &[u8],
    extra: u8,
) -> Result<(), TestCaseError> {
    for cut in 0..bytes.len() {
        prop_assert!(
            codec::decode::<T>(&bytes[..cut]).is_err(),
            "prefix of {cut} bytes accepted"
        );
    }
    let mut longer = bytes.to_vec();
    longer.push(extra);
    prop_assert_eq!(
        codec::decode::<T>(&longer).unwrap_err(),
        DecodeError::TrailingBytes(1)
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn client_frames_round_trip(f in client_frame()) {
        let bytes = codec::encode(&f);
        prop_assert_eq!(decode_client_frame(&bytes).unwrap(), f);
    }

    #[test]
    fn agent_frames_round_trip(f in agent_frame()) {
        let bytes = codec::encode(&f);
        prop_assert_eq!(decode_agent_frame(&bytes).unwrap(), f);
    }

    #[test]
    fn truncated_or_extended_client_frames_are_refused(f in client_frame(), extra in any::<u8>()) {
        assert_strict::<ClientFrame>(&codec::encode(&f), extra)?;
    }

    #[test]
    fn truncated_or_extended_agent_frames_are_refused(f in agent_frame(), extra in any::<u8>()) {
        assert_strict::<AgentFrame>(&codec::encode(&f), extra)?;
    }

    #[test]
    fn hello_version_is_readable_whatever_follows(version in any::<u32>(), tail in bytes()) {
        let mut bytes = codec::encode(&ClientFrame::Hello(Hello { protocol_version: version, nonce: [7; 32] }));
        bytes.truncate(bytes.len() - 32);
        bytes.extend_from_slice(&tail);
        prop_assert_eq!(peek_hello_version(&bytes), Some(version));
    }

    #[test]
    fn random_bytes_never_panic_the_decoders(data in vec(any::<u8>(), 0..2048)) {
        let _ = decode_client_frame(&data);
        let _ = decode_agent_frame(&data);
        let _ = peek_hello_version(&data);
        let _ = frame::read_frame(&mut &data[..]);
        let _ = FrameReader::new().poll_read(&mut &data[..]);
    }

    #[test]
    fn mutated_valid_frames_never_panic_the_decoders(
        f in client_frame(), g in agent_frame(), at in any::<prop::sample::Index>(), b in any::<u8>()
    ) {
        for mut bytes in [codec::encode(&f), codec::encode(&g)] {
            if !bytes.is_empty() {
                let i = at.index(bytes.len());
                bytes[i] = b;
            }
            let _ = decode_client_frame(&bytes);
            let _ = decode_agent_frame(&bytes);
        }
    }
}

#[test]
fn request_frame_is_refused_as_hello() {
    let body = codec::encode(&ClientFrame::Request(Request {
        id: 1,
        op: Operation::Stat { path: "/".into() },
    }));
    assert_eq!(peek_hello_version(&body), None);
    assert_eq!(peek_hello_version(&[]), None);
}
