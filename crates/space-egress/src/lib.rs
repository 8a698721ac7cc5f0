//! Egress policy for SPACE sandboxes, as pure code: no I/O, no clock, no async.
//!
//! The control plane validates a create's `network` field and `PATCH …/network` with
//! [`Policy`]; the worker builds its nftables sets, its resolver and its SNI/Host proxy
//! on [`GlobalDeny`], the decision functions, the [`plan`], [`sniff`] and [`dns`].
//! Every parser is bounded and returns an error rather than panicking on hostile input.
//!
//! # Semantics
//!
//! A policy is `{"mode": "none" | "egress", "allow": [rule…], "deny": [rule…]}`. A rule
//! is an exact name (`pypi.org`), a wildcard (`*.githubusercontent.com`: every name
//! strictly below it, not the name itself), or an address or network
//! (`203.0.113.0/24`, `2001:db8::1`). Names are lowercased, lose one trailing dot, and
//! must be LDH names (labels of 1–63 letters, digits and inner hyphens, 253
//! characters in all); an internationalized name is given in punycode (`xn--…`).
//!
//! - Mode `none` allows nothing (lists are kept, for a later switch to `egress`).
//! - Mode `egress` with an empty `allow` allows everything not denied; with a
//!   non-empty `allow`, only what matches it.
//! - `deny` always beats `allow`; the global deny list beats both.
//! - Names and addresses are matched separately. [`decide_name`] (a DNS question, a
//!   request's `Host`, a ClientHello's SNI) looks at name rules only. [`decide_addr`]
//!   (a connection reached without a name: another port, an address literal) looks at
//!   the global list and at address rules only — a name rule never allows an address,
//!   so such a connection passes only by an address rule or an empty allow list.
//!   [`decide_named`] (a connection the proxy opens itself to an address it resolved
//!   for an allowed name) needs the name allowed and the address past the global list
//!   and the sandbox's address denies.
//! - Addresses are judged in canonical form: `::ffff:a.b.c.d` is `a.b.c.d`, in the
//!   global list and in rules alike.
//!
//! Refusals carry the rule that refused and its [`Layer`], for the sandbox's events
//! and the per-rule counters.

#![forbid(unsafe_code)]

mod decide;
pub mod dns;
mod global;
mod net;
pub mod plan;
mod policy;
pub mod sniff;

#[cfg(test)]
mod sniff_fixtures;

pub use decide::{
    ADDRESS_NOT_ALLOWED, Decision, Layer, MODE_NONE, NAME_NOT_ALLOWED, decide_addr, decide_name,
    decide_named,
};
pub use global::{
    GlobalDeny, GlobalDenyBuilder, GlobalError, Listener, MAX_OPERATOR_ENTRIES,
    translation_prefixes,
};
pub use net::{IpNet, NetError, canonical};
pub use policy::{
    DnsName, MAX_LABEL, MAX_NAME, MAX_RULE_TEXT, MAX_RULES, NameError, NetworkMode, Policy,
    PolicyError, Rule, RuleError,
};
