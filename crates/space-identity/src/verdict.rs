//! The comparator's answers and their reason codes.
//!
//! `Deny` and `RefreshRoute` are distinct types until a response is written: only a
//! refresh reason can trigger route repair.

use std::fmt;

/// The comparator's verdict on one request or stream open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The capability selects exactly this receiver's running execution.
    Allow,
    /// The capability is genuine but selects another incarnation or placement of the
    /// same sandbox: the sender should resolve the current route and may retry once.
    RefreshRoute {
        /// Why the route is stale.
        reason: RefreshReason,
    },
    /// Refused; never retried.
    Deny {
        /// Why.
        reason: DenyReason,
    },
}

impl Verdict {
    /// The reason code as sent on the wire and counted in metrics (`"allow"` for
    /// [`Verdict::Allow`]).
    pub const fn reason_str(&self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::RefreshRoute { reason } => reason.as_str(),
            Self::Deny { reason } => reason.as_str(),
        }
    }

    /// `"allow"`, `"refresh_route"` or `"deny"`.
    pub const fn kind_str(&self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::RefreshRoute { .. } => "refresh_route",
            Self::Deny { .. } => "deny",
        }
    }
}

impl From<DenyReason> for Verdict {
    fn from(reason: DenyReason) -> Self {
        Self::Deny { reason }
    }
}

impl From<RefreshReason> for Verdict {
    fn from(reason: RefreshReason) -> Self {
        Self::RefreshRoute { reason }
    }
}

macro_rules! reason_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)+
        }

        impl $name {
            /// Every reason, for metrics that pre-register their label values.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// Stable string form, used on the wire and as a metric label.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = crate::ParseIdError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $(if s == $text {
                    return Ok($name::$variant);
                })+
                Err(crate::ParseIdError::new("reason"))
            }
        }
    };
}

reason_enum!(
    /// Why a request was denied. Denials are final.
    DenyReason {
        /// Larger than [`crate::MAX_CAPABILITY_BYTES`]; refused before decoding.
        Oversized => "oversized",
        /// Not a capability: bad text, truncated, unknown or duplicate claims,
        /// trailing bytes, a required claim missing, an invalid value.
        Malformed => "malformed",
        /// A format version this receiver does not know.
        UnsupportedVersion => "unsupported_version",
        /// The key ID is not in this receiver's installed bundle.
        UnknownKey => "unknown_key",
        /// The key exists but `now` is outside its validity window.
        KeyNotValid => "key_not_valid",
        /// The key may not sign capabilities of this purpose.
        WrongKeyPurpose => "wrong_key_purpose",
        /// The signature does not verify (strictly).
        BadSignature => "bad_signature",
        /// `expires_at - issued_at` is over the maximum lifetime, or negative.
        LifetimeTooLong => "lifetime_too_long",
        /// Past `expires_at` plus skew.
        Expired => "expired",
        /// `issued_at` is further in the future than the skew allows.
        NotYetValid => "not_yet_valid",
        /// The capability's purpose is not this endpoint's.
        WrongPurpose => "wrong_purpose",
        /// The access set lacks the access this operation needs.
        AccessDenied => "access_denied",
        /// Service port differs from the capability's.
        WrongPort => "wrong_port",
        /// Service protocol differs from the capability's.
        WrongProtocol => "wrong_protocol",
        /// The port is not exposed by this sandbox.
        PortNotExposed => "port_not_exposed",
        /// The request or endpoint belongs to another sandbox than the capability.
        SandboxMismatch => "sandbox_mismatch",
        /// This receiver has no record of the sandbox.
        UnknownSandbox => "unknown_sandbox",
    }
);

reason_enum!(
    /// Why a genuine capability selects another incarnation than this receiver's.
    RefreshReason {
        /// The capability names another worker.
        WrongWorker => "wrong_worker",
        /// This receiver retired the execution (it keeps a tombstone).
        Retired => "retired",
        /// The capability names an older generation than the installed one.
        StaleGeneration => "stale_generation",
        /// The capability names a newer generation than the installed one.
        GenerationAhead => "generation_ahead",
        /// Same generation, different execution ID.
        ExecutionMismatch => "execution_mismatch",
        /// Substrate or pod UID differ.
        PlacementMismatch => "placement_mismatch",
        /// Same route, another activation attempt.
        StaleActivation => "stale_activation",
        /// The installed execution is not running yet (starting).
        NotRunning => "not_running",
    }
);
