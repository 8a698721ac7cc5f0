//! Identifiers and the route they form.
//!
//! Every type here has a text form that is safe in URLs, HTTP headers and logs
//! (lowercase ASCII letters, digits, `_` and `-`), and parsing is strict: a value has
//! exactly one text form, so two strings that parse to the same ID are equal.

use std::fmt;
use std::str::FromStr;

use crate::codec::{base32_decode_16, base32_encode_16};

/// Why a text form was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseIdError {
    kind: &'static str,
}

impl ParseIdError {
    pub(crate) const fn new(kind: &'static str) -> Self {
        Self { kind }
    }

    /// Which kind of identifier failed to parse (`"sandbox id"`, `"worker id"` …).
    pub fn kind(&self) -> &'static str {
        self.kind
    }
}

impl fmt::Display for ParseIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a valid {}", self.kind)
    }
}

impl std::error::Error for ParseIdError {}

macro_rules! random_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name([u8; 16]);

        impl $name {
            /// Text prefix of this identifier.
            pub const PREFIX: &'static str = $prefix;

            /// Wraps 16 bytes. The caller supplies the randomness: this crate does no I/O.
            pub const fn from_bytes(bytes: [u8; 16]) -> Self {
                Self(bytes)
            }

            /// The raw 16 bytes.
            pub const fn as_bytes(&self) -> &[u8; 16] {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str($prefix)?;
                f.write_str(base32_encode_16(&self.0).as_str())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self, f)
            }
        }

        impl FromStr for $name {
            type Err = ParseIdError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let rest = s.strip_prefix($prefix).ok_or(ParseIdError::new($kind))?;
                base32_decode_16(rest).map(Self).ok_or(ParseIdError::new($kind))
            }
        }

        crate::codec::serde_text!($name);
    };
}

random_id!(
    /// The stable ID of a sandbox (`sbx_…`): what a caller is authorized for.
    SandboxId,
    "sbx_",
    "sandbox id"
);
random_id!(
    /// The random 128-bit ID of one execution (`exe_…`).
    ExecutionId,
    "exe_",
    "execution id"
);
random_id!(
    /// The random ID of one capability (`tok_…`), for logs and audit.
    TokenId,
    "tok_",
    "token id"
);

/// Generation of an execution: 1, 2, 3 … per sandbox, never reused. Its serde form
/// (behind the `serde` feature) is the bare number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Generation(pub u64);

impl Generation {
    /// Before a sandbox's first execution: no execution has it.
    pub const NONE: Self = Self(0);

    /// A sandbox's first execution: it starts with no files.
    pub const FIRST: Self = Self(1);

    /// The generation allocated after this one.
    #[must_use]
    pub const fn next(self) -> Self {
        Self(self.0 + 1)
    }

    /// The number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

#[cfg(feature = "serde")]
impl ::serde::Serialize for Generation {
    fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

#[cfg(feature = "serde")]
impl<'de> ::serde::Deserialize<'de> for Generation {
    fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <u64 as ::serde::Deserialize>::deserialize(d).map(Self)
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One runtime incarnation of a sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Execution {
    /// Grows with every new execution of the sandbox.
    pub generation: Generation,
    /// Random, so that two incarnations never share an identity even if a
    /// generation counter were lost.
    pub id: ExecutionId,
}

impl fmt::Display for Execution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.id, self.generation)
    }
}

/// The name of a worker: 1 to 63 characters of `a-z`, `0-9` and `-`, starting with a
/// letter or digit (a DNS label, so it fits in host names and URLs).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(Box<str>);

impl WorkerId {
    /// Longest accepted worker name.
    pub const MAX_LEN: usize = 63;

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn is_valid(s: &[u8]) -> bool {
        !s.is_empty()
            && s.len() <= Self::MAX_LEN
            && s[0] != b'-'
            && s.iter()
                .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    }
}

impl FromStr for WorkerId {
    type Err = ParseIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if Self::is_valid(s.as_bytes()) {
            Ok(Self(s.into()))
        } else {
            Err(ParseIdError::new("worker id"))
        }
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WorkerId({})", &self.0)
    }
}

crate::codec::serde_text!(WorkerId);

/// Which isolation technology runs an execution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Substrate {
    /// Linux namespaces, cgroups and seccomp.
    Jail,
    /// A Firecracker microVM.
    Firecracker,
    /// A Kubernetes pod; its UID is part of the route.
    Kubernetes,
    /// A virtual machine under QEMU (its own kernel; appended: code 4).
    Vm,
}

impl Substrate {
    /// Stable text form.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Jail => "jail",
            Self::Firecracker => "firecracker",
            Self::Kubernetes => "kubernetes",
            Self::Vm => "vm",
        }
    }

    pub(crate) const fn code(self) -> u8 {
        match self {
            Self::Jail => 1,
            Self::Firecracker => 2,
            Self::Kubernetes => 3,
            Self::Vm => 4,
        }
    }

    pub(crate) const fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Jail),
            2 => Some(Self::Firecracker),
            3 => Some(Self::Kubernetes),
            4 => Some(Self::Vm),
            _ => None,
        }
    }
}

crate::codec::text_enum!(Substrate, "substrate", [Jail, Firecracker, Kubernetes, Vm]);

/// A Kubernetes pod UID (a UUID, written in its usual lowercase 8-4-4-4-12 form).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PodUid([u8; 16]);

impl PodUid {
    /// Wraps the 16 bytes of the UUID.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The raw 16 bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PodUid({self})")
    }
}

impl FromStr for PodUid {
    type Err = ParseIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const ERR: ParseIdError = ParseIdError::new("pod uid");
        let b = s.as_bytes();
        if b.len() != 36 {
            return Err(ERR);
        }
        let mut out = [0u8; 16];
        let mut nibbles = 0usize;
        for (i, &c) in b.iter().enumerate() {
            if matches!(i, 8 | 13 | 18 | 23) {
                if c != b'-' {
                    return Err(ERR);
                }
                continue;
            }
            let v = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                _ => return Err(ERR),
            };
            out[nibbles / 2] |= if nibbles % 2 == 0 { v << 4 } else { v };
            nibbles += 1;
        }
        Ok(Self(out))
    }
}

crate::codec::serde_text!(PodUid);

/// Where an execution runs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Placement {
    /// The worker hosting the execution.
    pub worker: WorkerId,
    /// The isolation technology.
    pub substrate: Substrate,
    /// Counts activation attempts within one execution (a VMM restarted under the same
    /// generation). Not part of [`RouteIdentity`].
    pub activation: u32,
    /// Kubernetes only.
    pub pod_uid: Option<PodUid>,
}

/// A sandbox, the execution selected for it and where that execution runs: what a
/// request is *selected* for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    /// The logical sandbox.
    pub sandbox: SandboxId,
    /// The selected execution.
    pub execution: Execution,
    /// Where it runs.
    pub placement: Placement,
}

impl Route {
    /// The route's identity: everything but the activation attempt.
    pub fn identity(&self) -> RouteIdentity {
        RouteIdentity {
            sandbox: self.sandbox,
            execution: self.execution,
            worker: self.placement.worker.clone(),
            substrate: self.placement.substrate,
            pod_uid: self.placement.pod_uid,
        }
    }

    /// Whether this route has the given identity (without building one).
    pub fn has_identity(&self, id: &RouteIdentity) -> bool {
        self.sandbox == id.sandbox
            && self.execution == id.execution
            && self.placement.worker == id.worker
            && self.placement.substrate == id.substrate
            && self.placement.pod_uid == id.pod_uid
    }
}

/// Sandbox + execution + placement without the activation attempt.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RouteIdentity {
    /// The logical sandbox.
    pub sandbox: SandboxId,
    /// The selected execution.
    pub execution: Execution,
    /// The worker hosting it.
    pub worker: WorkerId,
    /// The isolation technology.
    pub substrate: Substrate,
    /// Kubernetes only.
    pub pod_uid: Option<PodUid>,
}

/// One permitted kind of access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Run processes.
    Exec,
    /// Read files, list and stat.
    FsRead,
    /// Write, remove, rename and create files.
    FsWrite,
    /// Open a terminal.
    Terminal,
    /// Watch a directory.
    Watch,
    /// Pause, resume, snapshot.
    Lifecycle,
    /// Reach a service port through netgtw.
    ServicePort,
}

impl Access {
    /// Every access kind, in bit order.
    pub const ALL: [Access; 7] = [
        Access::Exec,
        Access::FsRead,
        Access::FsWrite,
        Access::Terminal,
        Access::Watch,
        Access::Lifecycle,
        Access::ServicePort,
    ];

    /// Stable text form.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Exec => "exec",
            Self::FsRead => "fs_read",
            Self::FsWrite => "fs_write",
            Self::Terminal => "terminal",
            Self::Watch => "watch",
            Self::Lifecycle => "lifecycle",
            Self::ServicePort => "service_port",
        }
    }

    const fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

crate::codec::text_enum!(
    Access,
    "access",
    [
        Exec,
        FsRead,
        FsWrite,
        Terminal,
        Watch,
        Lifecycle,
        ServicePort
    ]
);

/// A set of [`Access`] kinds. Never empty in a valid capability.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AccessSet(u8);

impl AccessSet {
    const VALID: u8 = 0b0111_1111;

    /// The empty set.
    pub const fn empty() -> Self {
        Self(0)
    }

    /// A set from a list.
    pub fn of(items: &[Access]) -> Self {
        items.iter().fold(Self::empty(), |s, a| s.with(*a))
    }

    /// This set plus `access`.
    #[must_use]
    pub const fn with(self, access: Access) -> Self {
        Self(self.0 | access.bit())
    }

    /// Whether `access` is in the set.
    pub const fn contains(self, access: Access) -> bool {
        self.0 & access.bit() != 0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The members, in bit order.
    pub fn iter(self) -> impl Iterator<Item = Access> {
        Access::ALL.into_iter().filter(move |a| self.contains(*a))
    }

    pub(crate) const fn bits(self) -> u8 {
        self.0
    }

    pub(crate) const fn from_bits(bits: u8) -> Option<Self> {
        if bits & !Self::VALID != 0 {
            None
        } else {
            Some(Self(bits))
        }
    }
}

impl fmt::Debug for AccessSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// What a capability is for: which kind of receiver accepts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Purpose {
    /// Operations through sbx-manager.
    Control,
    /// Service-port traffic through netgtw.
    ServicePort,
}

impl Purpose {
    /// Stable text form.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Control => "control",
            Self::ServicePort => "service_port",
        }
    }

    pub(crate) const fn code(self) -> u8 {
        match self {
            Self::Control => 1,
            Self::ServicePort => 2,
        }
    }

    pub(crate) const fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Control),
            2 => Some(Self::ServicePort),
            _ => None,
        }
    }
}

crate::codec::text_enum!(Purpose, "purpose", [Control, ServicePort]);

/// Service-port protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// HTTP requests (no upgrades).
    Http,
    /// Raw TCP.
    Tcp,
}

impl Protocol {
    /// Stable text form.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Tcp => "tcp",
        }
    }

    pub(crate) const fn code(self) -> u8 {
        match self {
            Self::Http => 1,
            Self::Tcp => 2,
        }
    }

    pub(crate) const fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Http),
            2 => Some(Self::Tcp),
            _ => None,
        }
    }
}

crate::codec::text_enum!(Protocol, "protocol", [Http, Tcp]);

/// A guest port and the protocol allowed on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ServicePort {
    /// Guest TCP port, never 0.
    pub port: u16,
    /// Allowed protocol.
    pub protocol: Protocol,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_id_text_round_trips_and_is_canonical() {
        let id = SandboxId::from_bytes([0xab; 16]);
        let text = id.to_string();
        assert!(text.starts_with("sbx_"));
        assert_eq!(text.len(), 4 + 26);
        assert_eq!(text.parse::<SandboxId>().unwrap(), id);
        assert!(text.to_uppercase().parse::<SandboxId>().is_err());
        assert!(text.replace("sbx_", "exe_").parse::<SandboxId>().is_err());
        // A last character with non-zero padding bits is a second spelling: refused.
        let mut other = text.clone();
        other.pop();
        other.push('7');
        assert!(other.parse::<SandboxId>().is_err());
    }

    #[test]
    fn a_generation_counts_up_from_none() {
        assert_eq!(Generation::NONE.next(), Generation::FIRST);
        assert_eq!(Generation(41).next().get(), 42);
        assert!(Generation(2) > Generation(1));
        assert_eq!(Generation::default(), Generation::NONE);
    }

    #[cfg(feature = "serde")]
    #[test]
    fn a_generation_is_written_as_the_bare_number() {
        assert_eq!(serde_json::to_string(&Generation(7)).unwrap(), "7");
        assert_eq!(
            serde_json::from_str::<Generation>("18446744073709551615").unwrap(),
            Generation(u64::MAX)
        );
        assert!(serde_json::from_str::<Generation>("\"7\"").is_err());
        assert!(serde_json::from_str::<Generation>("-1").is_err());
    }

    #[test]
    fn worker_id_accepts_only_dns_labels() {
        assert!("w1".parse::<WorkerId>().is_ok());
        assert!("worker-a-01".parse::<WorkerId>().is_ok());
        for bad in ["", "-w", "W1", "w/1", "w 1", "w.1", &"a".repeat(64)] {
            assert!(bad.parse::<WorkerId>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn pod_uid_round_trips_in_uuid_form() {
        let s = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
        let uid: PodUid = s.parse().unwrap();
        assert_eq!(uid.to_string(), s);
        assert!(s.to_uppercase().parse::<PodUid>().is_err());
        assert!(
            "0f1e2d3c4b5a-6978-8796-a5b4c3d2e1f0-"
                .parse::<PodUid>()
                .is_err()
        );
    }

    #[test]
    fn access_set_rejects_unknown_bits() {
        assert!(AccessSet::from_bits(0x80).is_none());
        let set = AccessSet::of(&[Access::Exec, Access::Watch]);
        assert_eq!(AccessSet::from_bits(set.bits()), Some(set));
        assert_eq!(
            set.iter().collect::<Vec<_>>(),
            [Access::Exec, Access::Watch]
        );
    }

    #[test]
    fn enums_parse_their_text_forms_only() {
        for s in Access::ALL {
            assert_eq!(s.as_str().parse::<Access>().unwrap(), s);
        }
        assert!("EXEC".parse::<Access>().is_err());
        assert_eq!("tcp".parse::<Protocol>().unwrap(), Protocol::Tcp);
        assert_eq!("jail".parse::<Substrate>().unwrap(), Substrate::Jail);
        assert_eq!("vm".parse::<Substrate>().unwrap(), Substrate::Vm);
        for s in [
            Substrate::Jail,
            Substrate::Firecracker,
            Substrate::Kubernetes,
            Substrate::Vm,
        ] {
            assert_eq!(Substrate::from_code(s.code()), Some(s));
        }
        assert_eq!(Substrate::from_code(5), None);
        assert!("any".parse::<Purpose>().is_err());
    }
}
