//! A sandbox's network policy on the command line: built from `--net`, `--allow` and
//! `--deny` (`space sandbox create`, `space sandbox network`), and said in one line
//! (`space sandbox get`, `space sandbox network`).

use space_client::{Client, NetworkMode, Policy};
use space_egress::PolicyError;
use space_identity::SandboxId;

use super::errors;
use super::output::{print_json, sandbox_id};
use crate::args::Cli;

/// The policy the flags ask for: `None` when they ask for none (the platform's
/// default applies). `--allow` and `--deny` need `--net egress`.
pub(crate) fn from_flags(
    net: Option<NetworkMode>,
    allow: &[String],
    deny: &[String],
) -> Result<Option<Policy>, String> {
    let rules = !allow.is_empty() || !deny.is_empty();
    match net {
        None if !rules => Ok(None),
        Some(NetworkMode::Egress) => Policy::parse(NetworkMode::Egress, allow, deny)
            .map(Some)
            .map_err(flag_error),
        Some(NetworkMode::None) if !rules => Ok(Some(Policy::none())),
        _ => Err(
            "--allow and --deny need --net egress (without it the sandbox has no network)".into(),
        ),
    }
}

/// A rule refused, said with the flag that gave it.
fn flag_error(e: PolicyError) -> String {
    match e {
        PolicyError::BadRule {
            list, entry, error, ..
        } => format!("--{list} {entry:?}: {error}"),
        PolicyError::TooManyRules { list } => {
            format!("more than {} --{list} rules", space_egress::MAX_RULES)
        }
    }
}

/// The policy of sandbox `id` in one line; mode `none` says how to turn it on.
pub(crate) fn line(id: &SandboxId, p: &Policy) -> String {
    let rules = |r: &[space_egress::Rule]| {
        r.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    match p.mode {
        NetworkMode::None => {
            let mut text = format!(
                "network: off (loopback only) — turn it on with: space sandbox network {id} --net egress [--allow NAME|CIDR …]"
            );
            if !p.allow().is_empty() || !p.deny().is_empty() {
                text.push_str(&format!(
                    " (its lists are kept for egress: allow: {}; deny: {})",
                    or_dash(rules(p.allow())),
                    or_dash(rules(p.deny()))
                ));
            }
            text
        }
        NetworkMode::Egress => {
            let allow = match p.allow() {
                [] => "everything not denied".to_owned(),
                some => rules(some),
            };
            let mut text = format!("network: egress, allow: {allow}");
            if !p.deny().is_empty() {
                text.push_str(&format!("; deny: {}", rules(p.deny())));
            }
            text
        }
    }
}

/// A cell of text the sandbox chose (a name it asked for): control characters are
/// shown escaped, never sent to the terminal.
fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

/// The rows of `space sandbox events`.
fn event_rows(events: &[space_proto::api::SandboxEvent]) -> Vec<Vec<String>> {
    events
        .iter()
        .map(|e| {
            vec![
                printable(&e.at),
                printable(&e.via),
                printable(&e.target),
                printable(&e.layer),
                printable(&e.rule),
            ]
        })
        .collect()
}

/// Prints `space sandbox events` as a table.
pub(crate) fn print_events(events: &[space_proto::api::SandboxEvent]) {
    super::output::table(
        &["AT", "VIA", "TARGET", "REFUSED BY", "RULE"],
        &event_rows(events),
    );
}

fn or_dash(s: String) -> String {
    if s.is_empty() { "-".into() } else { s }
}

/// `space sandbox network ID [--net MODE [--allow RULE …] [--deny RULE …]]`: replaces
/// the policy when `--net` is given, then prints it (as JSON with `--json`).
pub(crate) async fn run(
    c: &Client,
    cli: &Cli,
    url: &str,
    id: &str,
    net: Option<NetworkMode>,
    allow: &[String],
    deny: &[String],
) -> Result<i32, String> {
    let sdk = |e: space_client::Error| errors::describe(&e, url);
    let id = sandbox_id(id)?;
    let s = match from_flags(net, allow, deny)? {
        Some(policy) => c.set_network(&id, &policy).await.map_err(sdk)?,
        None => c.sandbox(&id).await.map_err(sdk)?,
    };
    if cli.json {
        print_json(&s.network);
    } else {
        println!("{}", line(&s.id, &s.network));
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn no_network_flag_asks_for_the_platforms_default() {
        assert_eq!(from_flags(None, &[], &[]), Ok(None));
        assert_eq!(
            from_flags(Some(NetworkMode::None), &[], &[]),
            Ok(Some(Policy::none()))
        );
    }

    #[test]
    fn allow_or_deny_without_net_egress_is_refused_saying_so() {
        let want = Err(
            "--allow and --deny need --net egress (without it the sandbox has no network)".into(),
        );
        let allow = strings(&["pypi.org"]);
        assert_eq!(from_flags(None, &allow, &[]), want);
        assert_eq!(from_flags(None, &[], &allow), want);
        assert_eq!(from_flags(Some(NetworkMode::None), &allow, &[]), want);
    }

    #[test]
    fn net_egress_takes_its_rules_in_canonical_form() {
        let p = from_flags(
            Some(NetworkMode::Egress),
            &strings(&["PyPI.org.", "*.GitHub.com"]),
            &strings(&["10.0.0.0/8"]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.mode, NetworkMode::Egress);
        let text: Vec<String> = p.allow().iter().map(ToString::to_string).collect();
        assert_eq!(text, ["pypi.org", "*.github.com"]);
        assert_eq!(p.deny()[0].to_string(), "10.0.0.0/8");
    }

    #[test]
    fn a_bad_rule_is_refused_with_its_flag_and_its_reason() {
        let e = from_flags(
            Some(NetworkMode::Egress),
            &strings(&["pypi.org", "bad_name"]),
            &[],
        )
        .unwrap_err();
        assert_eq!(
            e,
            r#"--allow "bad_name": not a name: character '_' is not a letter, digit or hyphen"#
        );
        let e = from_flags(Some(NetworkMode::Egress), &[], &strings(&["10.0.0.0/33"])).unwrap_err();
        assert!(
            e.starts_with(r#"--deny "10.0.0.0/33": not an address or network"#),
            "{e}"
        );
    }

    #[test]
    fn the_line_of_a_sandbox_without_network_says_it_is_off_and_how_to_turn_it_on() {
        let id = SandboxId::from_bytes([1; 16]);
        assert_eq!(
            line(&id, &Policy::none()),
            format!(
                "network: off (loopback only) — turn it on with: space sandbox network {id} --net egress [--allow NAME|CIDR …]"
            )
        );
        let kept = Policy::parse(NetworkMode::None, &["pypi.org"], &[] as &[&str]).unwrap();
        assert!(
            line(&id, &kept)
                .ends_with(" (its lists are kept for egress: allow: pypi.org; deny: -)"),
            "{}",
            line(&id, &kept)
        );
    }

    #[test]
    fn an_event_naming_control_characters_reaches_the_terminal_escaped() {
        let e = space_proto::api::SandboxEvent {
            at: "2026-12-01T00:00:00Z".into(),
            kind: "network_refused".into(),
            via: "http".into(),
            target: "evil\u{1b}[2J.test".into(),
            layer: "sandbox".into(),
            rule: "name not in the allow list".into(),
        };
        let rows = event_rows(&[e]);
        assert_eq!(rows[0][2], "evil\\u{1b}[2J.test");
        assert!(rows[0].iter().all(|c| !c.chars().any(char::is_control)));
    }

    #[test]
    fn the_line_of_an_egress_sandbox_names_its_lists() {
        let id = SandboxId::from_bytes([1; 16]);
        let p = Policy::parse(
            NetworkMode::Egress,
            &["pypi.org", "*.github.com"],
            &["10.0.0.0/8"],
        )
        .unwrap();
        assert_eq!(
            line(&id, &p),
            "network: egress, allow: pypi.org, *.github.com; deny: 10.0.0.0/8"
        );
        let open = Policy::parse(NetworkMode::Egress, &[] as &[&str], &[] as &[&str]).unwrap();
        assert_eq!(
            line(&id, &open),
            "network: egress, allow: everything not denied"
        );
    }
}
