//! The per-sandbox policy: a mode, an allow list and a deny list of rules.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::net::{IpNet, NetError};

/// Most rules in one list (`allow` or `deny`).
pub const MAX_RULES: usize = 256;

/// Longest rule text looked at (`*.` and a 253-character name).
pub const MAX_RULE_TEXT: usize = 255;

/// Longest DNS name in text form, without the trailing dot.
pub const MAX_NAME: usize = 253;

/// Longest label of a DNS name.
pub const MAX_LABEL: usize = 63;

/// Whether a sandbox has a network beyond its loopback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// Loopback only: nothing leaves the sandbox.
    #[default]
    None,
    /// Outbound connections and DNS under the policy's lists and the global deny list.
    Egress,
}

/// A validated DNS name: lowercase ASCII, no trailing dot, labels of 1–63 letters,
/// digits and inner hyphens, at most 253 characters, last label not all digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DnsName(String);

/// Why a DNS name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("empty name")]
    Empty,
    #[error("longer than {MAX_NAME} characters")]
    TooLong,
    #[error("empty label")]
    EmptyLabel,
    #[error("label longer than {MAX_LABEL} characters")]
    LabelTooLong,
    #[error("non-ASCII name: give an internationalized name in punycode (xn--…)")]
    NotAscii,
    #[error("character {0:?} is not a letter, digit or hyphen")]
    BadCharacter(char),
    #[error("a label starts or ends with a hyphen")]
    EdgeHyphen,
    #[error("the last label is all digits (an address? write it without a name)")]
    NumericTld,
}

impl DnsName {
    /// Parses a name: ASCII letters are lowercased and one trailing dot is dropped.
    pub fn parse(text: &str) -> Result<Self, NameError> {
        if text.len() > MAX_NAME + 1 {
            return Err(NameError::TooLong);
        }
        if !text.is_ascii() {
            return Err(NameError::NotAscii);
        }
        let text = text.strip_suffix('.').unwrap_or(text);
        if text.is_empty() {
            return Err(NameError::Empty);
        }
        if text.len() > MAX_NAME {
            return Err(NameError::TooLong);
        }
        let lower = text.to_ascii_lowercase();
        let mut last = "";
        for label in lower.split('.') {
            if label.is_empty() {
                return Err(NameError::EmptyLabel);
            }
            if label.len() > MAX_LABEL {
                return Err(NameError::LabelTooLong);
            }
            if let Some(bad) = label
                .chars()
                .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
            {
                return Err(NameError::BadCharacter(bad));
            }
            if label.starts_with('-') || label.ends_with('-') {
                return Err(NameError::EdgeHyphen);
            }
            last = label;
        }
        if last.bytes().all(|b| b.is_ascii_digit()) {
            return Err(NameError::NumericTld);
        }
        Ok(DnsName(lower))
    }

    /// The name as text (lowercase, no trailing dot).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `self` lies strictly below `suffix` (`a.b.example.com` below
    /// `example.com`; `example.com` is not below itself).
    pub fn is_strictly_below(&self, suffix: &DnsName) -> bool {
        self.0.len() > suffix.0.len()
            && self.0.ends_with(suffix.as_str())
            && self.0.as_bytes()[self.0.len() - suffix.0.len() - 1] == b'.'
    }
}

impl fmt::Display for DnsName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One entry of an allow or deny list.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Exactly this name (`pypi.org`).
    Name(DnsName),
    /// Any name strictly below this one (`*.githubusercontent.com`), not the name itself.
    Wildcard(DnsName),
    /// An address or a network (`203.0.113.0/24`, `2001:db8::1`).
    Net(IpNet),
}

/// Why a rule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("empty rule")]
    Empty,
    #[error("longer than {MAX_RULE_TEXT} characters")]
    TooLong,
    #[error("a wildcard is only `*.` followed by a name (`*.example.com`)")]
    BadWildcard,
    #[error("not a name: {0}")]
    Name(#[from] NameError),
    #[error("not an address or network: {0}")]
    Net(#[from] NetError),
}

impl Rule {
    /// Parses `name`, `*.name`, `address` or `address/prefix`.
    pub fn parse(text: &str) -> Result<Self, RuleError> {
        if text.is_empty() {
            return Err(RuleError::Empty);
        }
        if text.len() > MAX_RULE_TEXT {
            return Err(RuleError::TooLong);
        }
        if let Some(rest) = text.strip_prefix("*.") {
            return Ok(Rule::Wildcard(DnsName::parse(rest)?));
        }
        if text.contains('*') {
            return Err(RuleError::BadWildcard);
        }
        // Anything with a colon or a slash, or made of digits and dots, is meant as an
        // address: report it as one rather than as a bad name.
        let looks_like_address = text.contains(':')
            || text.contains('/')
            || text.bytes().all(|b| b.is_ascii_digit() || b == b'.');
        if looks_like_address {
            return Ok(Rule::Net(text.parse()?));
        }
        Ok(Rule::Name(DnsName::parse(text)?))
    }

    /// Whether this rule matches `name` (address rules never match a name).
    pub fn matches_name(&self, name: &DnsName) -> bool {
        match self {
            Rule::Name(n) => n == name,
            Rule::Wildcard(suffix) => name.is_strictly_below(suffix),
            Rule::Net(_) => false,
        }
    }

    /// Whether this rule matches the address `ip` (name rules never match an address).
    pub fn matches_addr(&self, ip: std::net::IpAddr) -> bool {
        match self {
            Rule::Net(net) => net.contains(ip),
            Rule::Name(_) | Rule::Wildcard(_) => false,
        }
    }
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Rule::parse(text)
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Name(n) => write!(f, "{n}"),
            Rule::Wildcard(n) => write!(f, "*.{n}"),
            Rule::Net(net) => write!(f, "{net}"),
        }
    }
}

/// Why a policy was refused; the message names the list, the index and the entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("{list}[{index}] {entry:?}: {error}")]
    BadRule {
        list: &'static str,
        index: usize,
        /// The entry as given, cut to 80 characters.
        entry: String,
        error: RuleError,
    },
    #[error("{list} has more than {MAX_RULES} rules")]
    TooManyRules { list: &'static str },
}

/// A sandbox's network policy.
///
/// Serialized as `{"mode":"none"|"egress","allow":[…],"deny":[…]}`; `allow` and
/// `deny` may be left out (empty), unknown fields are refused, and rules are strings
/// both ways (in their canonical form on the way out).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub mode: NetworkMode,
    #[serde(
        default,
        serialize_with = "serialize_rules",
        deserialize_with = "deserialize_allow"
    )]
    allow: Vec<Rule>,
    #[serde(
        default,
        serialize_with = "serialize_rules",
        deserialize_with = "deserialize_deny"
    )]
    deny: Vec<Rule>,
}

impl Policy {
    /// The policy of a sandbox without a network.
    pub fn none() -> Self {
        Self::default()
    }

    /// A policy from parsed rules; refused when a list has more than [`MAX_RULES`].
    pub fn new(mode: NetworkMode, allow: Vec<Rule>, deny: Vec<Rule>) -> Result<Self, PolicyError> {
        if allow.len() > MAX_RULES {
            return Err(PolicyError::TooManyRules { list: "allow" });
        }
        if deny.len() > MAX_RULES {
            return Err(PolicyError::TooManyRules { list: "deny" });
        }
        Ok(Policy { mode, allow, deny })
    }

    /// A policy from rule texts (the CLI's `--allow` / `--deny`).
    pub fn parse<A: AsRef<str>, D: AsRef<str>>(
        mode: NetworkMode,
        allow: &[A],
        deny: &[D],
    ) -> Result<Self, PolicyError> {
        let allow = parse_list("allow", allow.iter().map(AsRef::as_ref))?;
        let deny = parse_list("deny", deny.iter().map(AsRef::as_ref))?;
        Policy::new(mode, allow, deny)
    }

    /// The allow list.
    pub fn allow(&self) -> &[Rule] {
        &self.allow
    }

    /// The deny list.
    pub fn deny(&self) -> &[Rule] {
        &self.deny
    }

    /// The address rules of the allow list (for a packet filter's sets).
    pub fn allowed_networks(&self) -> impl Iterator<Item = IpNet> + '_ {
        networks(&self.allow)
    }

    /// The address rules of the deny list.
    pub fn denied_networks(&self) -> impl Iterator<Item = IpNet> + '_ {
        networks(&self.deny)
    }
}

fn networks(rules: &[Rule]) -> impl Iterator<Item = IpNet> + '_ {
    rules.iter().filter_map(|r| match r {
        Rule::Net(net) => Some(*net),
        Rule::Name(_) | Rule::Wildcard(_) => None,
    })
}

fn parse_list<'a>(
    list: &'static str,
    texts: impl Iterator<Item = &'a str>,
) -> Result<Vec<Rule>, PolicyError> {
    let mut rules = Vec::new();
    for (index, text) in texts.enumerate() {
        if index >= MAX_RULES {
            return Err(PolicyError::TooManyRules { list });
        }
        rules.push(parse_entry(list, index, text)?);
    }
    Ok(rules)
}

fn parse_entry(list: &'static str, index: usize, text: &str) -> Result<Rule, PolicyError> {
    Rule::parse(text).map_err(|error| PolicyError::BadRule {
        list,
        index,
        entry: text.chars().take(80).collect(),
        error,
    })
}

fn serialize_rules<S: Serializer>(rules: &[Rule], serializer: S) -> Result<S::Ok, S::Error> {
    let mut seq = serializer.serialize_seq(Some(rules.len()))?;
    for rule in rules {
        seq.serialize_element(&rule.to_string())?;
    }
    seq.end()
}

fn deserialize_allow<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Rule>, D::Error> {
    d.deserialize_seq(RulesVisitor { list: "allow" })
}

fn deserialize_deny<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Rule>, D::Error> {
    d.deserialize_seq(RulesVisitor { list: "deny" })
}

/// Reads a list of rule strings, stopping at the first entry past [`MAX_RULES`]
/// so a huge list is never held whole.
struct RulesVisitor {
    list: &'static str,
}

impl<'de> Visitor<'de> for RulesVisitor {
    type Value = Vec<Rule>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a list of at most {MAX_RULES} rule strings")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut rules = Vec::new();
        let mut index = 0;
        while let Some(text) = seq.next_element::<String>()? {
            if index >= MAX_RULES {
                return Err(de::Error::custom(PolicyError::TooManyRules {
                    list: self.list,
                }));
            }
            rules.push(parse_entry(self.list, index, &text).map_err(de::Error::custom)?);
            index += 1;
        }
        Ok(rules)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(text: &str) -> Rule {
        Rule::parse(text).unwrap()
    }

    fn name(text: &str) -> DnsName {
        DnsName::parse(text).unwrap()
    }

    #[test]
    fn names_are_lowercased_and_lose_one_trailing_dot() {
        assert_eq!(rule("PyPI.org."), Rule::Name(name("pypi.org")));
        assert_eq!(rule("PyPI.org.").to_string(), "pypi.org");
        assert_eq!(DnsName::parse("pypi.org.."), Err(NameError::EmptyLabel));
    }

    #[test]
    fn each_malformed_name_is_refused_with_its_reason() {
        let cases: &[(&str, NameError)] = &[
            ("", NameError::Empty),
            (".", NameError::Empty),
            ("a..b", NameError::EmptyLabel),
            (".a", NameError::EmptyLabel),
            ("-a.com", NameError::EdgeHyphen),
            ("a-.com", NameError::EdgeHyphen),
            ("a_b.com", NameError::BadCharacter('_')),
            ("a b.com", NameError::BadCharacter(' ')),
            ("bücher.de", NameError::NotAscii),
            ("a.123", NameError::NumericTld),
        ];
        for (text, error) in cases {
            assert_eq!(DnsName::parse(text).as_ref(), Err(error), "{text:?}");
        }
        assert_eq!(
            DnsName::parse(&"a".repeat(64)),
            Err(NameError::LabelTooLong)
        );
        assert!(DnsName::parse(&"a".repeat(63)).is_ok());
        assert!(DnsName::parse("xn--bcher-kva.de").is_ok());
    }

    #[test]
    fn a_name_of_253_characters_is_accepted_and_one_of_254_is_not() {
        let label = "a".repeat(63);
        let n253 = format!("{label}.{label}.{label}.{}", "b".repeat(61));
        assert_eq!(n253.len(), 253);
        assert!(DnsName::parse(&n253).is_ok());
        assert!(DnsName::parse(&format!("{n253}.")).is_ok());
        let n254 = format!("{label}.{label}.{label}.{}", "b".repeat(62));
        assert_eq!(DnsName::parse(&n254), Err(NameError::TooLong));
    }

    #[test]
    fn a_wildcard_matches_names_strictly_below_it_but_not_its_apex() {
        let w = rule("*.githubusercontent.com");
        assert!(w.matches_name(&name("raw.githubusercontent.com")));
        assert!(w.matches_name(&name("a.b.githubusercontent.com")));
        assert!(!w.matches_name(&name("githubusercontent.com")));
        assert!(!w.matches_name(&name("evilgithubusercontent.com")));
        assert!(!w.matches_name(&name("githubusercontent.com.evil.org")));
    }

    #[test]
    fn a_star_anywhere_but_the_first_label_is_refused() {
        for text in ["*", "*.", "a.*.com", "*a.com", "**.com", "*.*.com"] {
            assert!(Rule::parse(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn addresses_and_networks_are_rules_that_match_addresses_not_names() {
        let r = rule("203.0.113.0/24");
        assert!(r.matches_addr("203.0.113.9".parse().unwrap()));
        assert!(!r.matches_name(&name("example.com")));
        assert!(rule("2001:db8::/32").matches_addr("2001:db8::5".parse().unwrap()));
        assert!(!rule("pypi.org").matches_addr("203.0.113.9".parse().unwrap()));
        assert!(matches!(Rule::parse("1.2.3.999"), Err(RuleError::Net(_))));
        assert!(matches!(
            Rule::parse("203.0.113.1/24"),
            Err(RuleError::Net(_))
        ));
    }

    #[test]
    fn a_policy_reads_and_writes_the_documented_json() {
        let json = r#"{"mode":"egress","allow":["PyPI.org","*.githubusercontent.com","203.0.113.0/24","2001:db8::/32"],"deny":["evil.pypi.org"]}"#;
        let policy: Policy = serde_json::from_str(json).unwrap();
        assert_eq!(policy.mode, NetworkMode::Egress);
        assert_eq!(policy.allow().len(), 4);
        let nets: Vec<String> = policy.allowed_networks().map(|n| n.to_string()).collect();
        assert_eq!(nets, ["203.0.113.0/24", "2001:db8::/32"]);
        assert_eq!(policy.denied_networks().count(), 0);
        assert_eq!(
            serde_json::to_string(&policy).unwrap(),
            r#"{"mode":"egress","allow":["pypi.org","*.githubusercontent.com","203.0.113.0/24","2001:db8::/32"],"deny":["evil.pypi.org"]}"#
        );
        let none: Policy = serde_json::from_str(r#"{"mode":"none"}"#).unwrap();
        assert_eq!(none, Policy::none());
    }

    #[test]
    fn unknown_fields_and_modes_are_refused() {
        assert!(serde_json::from_str::<Policy>(r#"{"mode":"egress","alow":[]}"#).is_err());
        assert!(serde_json::from_str::<Policy>(r#"{"mode":"open"}"#).is_err());
        assert!(serde_json::from_str::<Policy>(r#"{"allow":[]}"#).is_err());
    }

    #[test]
    fn a_bad_entry_is_named_by_list_index_and_text() {
        let err =
            serde_json::from_str::<Policy>(r#"{"mode":"egress","deny":["ok.com","bad..com"]}"#)
                .unwrap_err()
                .to_string();
        assert!(
            err.contains(r#"deny[1] "bad..com": not a name: empty label"#),
            "{err}"
        );
        let err = Policy::parse(NetworkMode::Egress, &["10.0.0.1/8"], &[] as &[&str]).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"allow[0] "10.0.0.1/8": not an address or network: host bits are set (the network is 10.0.0.0/8)"#
        );
    }

    #[test]
    fn a_list_of_257_rules_is_refused_and_256_accepted() {
        let list =
            |n: usize| -> Vec<String> { (0..n).map(|i| format!("h{i}.example.com")).collect() };
        let json = |n| serde_json::json!({"mode": "egress", "allow": list(n)}).to_string();
        assert!(serde_json::from_str::<Policy>(&json(256)).is_ok());
        let err = serde_json::from_str::<Policy>(&json(257))
            .unwrap_err()
            .to_string();
        assert!(err.contains("allow has more than 256 rules"), "{err}");
        assert!(Policy::parse(NetworkMode::Egress, &[] as &[&str], &list(257)).is_err());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_rule_text_never_panics_and_a_parsed_rule_round_trips(text in "\\PC{0,300}") {
            if let Ok(rule) = Rule::parse(&text) {
                proptest::prop_assert_eq!(Rule::parse(&rule.to_string()), Ok(rule));
            }
        }

        #[test]
        fn rule_shaped_text_round_trips(text in "(\\*\\.)?[a-zA-Z0-9-]{1,12}(\\.[a-zA-Z0-9-]{1,12}){0,3}\\.?|[0-9a-f:.]{1,40}(/[0-9]{1,3})?") {
            if let Ok(rule) = Rule::parse(&text) {
                proptest::prop_assert_eq!(Rule::parse(&rule.to_string()), Ok(rule));
            }
        }

        #[test]
        fn arbitrary_policy_json_never_panics(
            mode in "none|egress|\\PC{0,8}",
            allow in proptest::collection::vec("\\PC{0,40}", 0..8),
            extra in proptest::option::of("[a-z]{1,8}"),
        ) {
            let mut value = serde_json::json!({"mode": mode, "allow": allow, "deny": allow});
            if let Some(field) = extra {
                value[field] = serde_json::json!(1);
            }
            if let Ok(policy) = serde_json::from_value::<Policy>(value) {
                let back = serde_json::to_string(&policy).unwrap();
                proptest::prop_assert_eq!(serde_json::from_str::<Policy>(&back).unwrap(), policy);
            }
        }
    }
}
