//! The HTTP bodies' wire forms: limits from the environment, timestamps, strict
//! request bodies, update tags, generations as bare numbers, 421 reasons.

use super::*;

#[test]
fn configured_limits_take_what_parses_and_keep_the_rest() {
    let env: std::collections::BTreeMap<&str, &str> = [
        ("SPACE_MAX_MEMORY_MIB", "2048"),
        ("SPACE_MAX_CPUS", "1.5"),
        ("SPACE_MAX_PIDS", "not a number"),
        ("SPACE_DEFAULT_DISK_MIB", "64"),
    ]
    .into_iter()
    .collect();
    let lookup = |k: &str| env.get(k).map(|v| v.to_string());
    let max = Limits::DEFAULT_MAXIMA.configured("MAX", lookup);
    assert_eq!(max.memory_bytes, 2048 << 20);
    assert_eq!(max.cpu_millis, 1500);
    assert_eq!(max.pids, Limits::DEFAULT_MAXIMA.pids);
    assert_eq!(max.disk_bytes, Limits::DEFAULT_MAXIMA.disk_bytes);
    let defaults = Limits::default().configured("DEFAULT", lookup);
    assert_eq!(defaults.disk_bytes, 64 << 20);
    assert_eq!(defaults.memory_bytes, Limits::default().memory_bytes);
    // Nonsense CPU counts are ignored, not turned into a huge or zero quota.
    let odd: std::collections::BTreeMap<&str, &str> =
        [("SPACE_MAX_CPUS", "inf")].into_iter().collect();
    let lookup = |k: &str| odd.get(k).map(|v| v.to_string());
    assert_eq!(
        Limits::DEFAULT_MAXIMA.configured("MAX", lookup).cpu_millis,
        8000
    );
}

#[test]
fn rfc3339_formats_known_instants() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339(1_795_996_800), "2026-11-30T00:00:00Z");
    assert_eq!(rfc3339(4_102_444_799), "2099-12-31T23:59:59Z");
}

#[test]
fn rfc3339_with_nanoseconds_formats_instants_before_and_after_the_epoch() {
    assert_eq!(rfc3339_nanos(0, 0), "1970-01-01T00:00:00.000000000Z");
    assert_eq!(
        rfc3339_nanos(1_795_996_800, 42),
        "2026-11-30T00:00:00.000000042Z"
    );
    assert_eq!(
        rfc3339_nanos(-1, 999_999_999),
        "1969-12-31T23:59:59.999999999Z"
    );
    assert_eq!(
        rfc3339_nanos(-86_400 * 365, 5),
        "1969-01-01T00:00:00.000000005Z"
    );
    // Out-of-range parts do not panic.
    assert!(rfc3339_nanos(i64::MIN, u32::MAX).ends_with(".999999999Z"));
    assert!(rfc3339_nanos(i64::MAX, 0).ends_with('Z'));
}

#[test]
fn an_exec_request_takes_a_pty_size_and_clamps_it_to_1_to_1000() {
    let r: ExecRequest =
        serde_json::from_str(r#"{"cmd":["sh"],"pty":{"rows":0,"cols":5000}}"#).unwrap();
    let size = r.pty.unwrap().clamped();
    assert_eq!((size.rows, size.cols), (1, 1000));
    assert!(
        serde_json::from_str::<ExecRequest>(r#"{"cmd":["sh"],"pty":{"rows":1,"cols":1,"x":1}}"#)
            .is_err()
    );
    assert!(
        serde_json::from_str::<ExecRequest>(r#"{"cmd":["sh"],"pty":{"rows":70000,"cols":1}}"#)
            .is_err()
    );
}

#[test]
fn request_bodies_refuse_unknown_fields() {
    assert!(serde_json::from_str::<CreateSandbox>(r#"{"templte":"x"}"#).is_err());
    assert!(serde_json::from_str::<ExecRequest>(r#"{"cmd":["ls"],"tmeout":1}"#).is_err());
    let c: CreateSandbox = serde_json::from_str(r#"{"ttl_secs":60}"#).unwrap();
    assert_eq!(c.ttl_secs, Some(60));
}

#[test]
fn updates_round_trip_with_a_kind_tag() {
    let u = Update::Retire {
        sandbox: SandboxId::from_bytes([1; 16]),
        generation: Generation(3),
        execution_id: ExecutionId::from_bytes([2; 16]),
    };
    let text = serde_json::to_string(&u).unwrap();
    assert!(text.contains(r#""kind":"retire""#), "{text}");
    assert_eq!(serde_json::from_str::<Update>(&text).unwrap(), u);
}

#[test]
fn a_generation_travels_as_the_bare_number_it_always_was() {
    let (sandbox, id) = (
        SandboxId::from_bytes([1; 16]),
        ExecutionId::from_bytes([2; 16]),
    );
    let retire = Update::Retire {
        sandbox,
        generation: Generation(3),
        execution_id: id,
    };
    let expected = format!(
        r#"{{"kind":"retire","sandbox":"{sandbox}","generation":3,"execution_id":"{id}"}}"#
    );
    assert_eq!(serde_json::to_string(&retire).unwrap(), expected);
    assert_eq!(serde_json::from_str::<Update>(&expected).unwrap(), retire);
    let view = ExecutionView {
        generation: Generation(u64::MAX),
        execution_id: id,
        worker: "w1".parse().unwrap(),
        substrate: Substrate::Jail,
        activation: 1,
    };
    assert_eq!(
        serde_json::to_string(&view).unwrap(),
        format!(
            r#"{{"generation":18446744073709551615,"execution_id":"{id}","worker":"w1","substrate":"jail","activation":1}}"#
        )
    );
    // A generation written as text was never accepted and still is not.
    let quoted = expected.replace(r#""generation":3"#, r#""generation":"3""#);
    assert!(serde_json::from_str::<Update>(&quoted).is_err());
}

#[test]
fn a_421_body_gives_its_refresh_reason_and_anything_else_not_running() {
    let body = |reason: Option<&str>| ErrorBody {
        error: "refresh_route".into(),
        message: String::new(),
        reason: reason.map(str::to_owned),
    };
    assert_eq!(
        refresh_reason(Some(&body(Some("wrong_worker")))),
        RefreshReason::WrongWorker
    );
    assert_eq!(
        refresh_reason(Some(&body(Some("retired")))),
        RefreshReason::Retired
    );
    for unknown in [Some(&body(Some("made_up"))), Some(&body(None)), None] {
        assert_eq!(refresh_reason(unknown), RefreshReason::NotRunning);
    }
}

#[test]
fn an_ack_state_travels_as_the_lowercase_name_it_always_had_and_nothing_else_parses() {
    for (state, text) in [
        (AckState::Running, "running"),
        (AckState::Paused, "paused"),
        (AckState::Retired, "retired"),
        (AckState::Installed, "installed"),
        (AckState::Failed, "failed"),
    ] {
        assert_eq!(state.as_str(), text);
        let ack = UpdateAck {
            state,
            message: None,
            bundle_version: 3,
            warm_ready: None,
        };
        let json = serde_json::to_string(&ack).unwrap();
        assert_eq!(json, format!(r#"{{"state":"{text}","bundle_version":3}}"#));
        assert_eq!(serde_json::from_str::<UpdateAck>(&json).unwrap(), ack);
    }
    for bad in ["Running", "stopped", ""] {
        let json = format!(r#"{{"state":"{bad}","bundle_version":3}}"#);
        assert!(serde_json::from_str::<UpdateAck>(&json).is_err(), "{bad}");
    }
}
