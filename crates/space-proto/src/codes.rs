//! The stable codes of error answers, typed: [`ErrorCode`] for the edge API's,
//! [`WorkerCode`] for a worker's node-api. Each has one wire form (`as_str`).

macro_rules! codes {
    ($(#[$tdoc:meta])* $name:ident; $($(#[$doc:meta])* $variant:ident => $text:literal,)+) => {
        $(#[$tdoc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$doc])* $variant,)+
        }

        impl $name {
            /// Every code.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// Its wire form.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

codes! {
    /// The stable codes of the edge API's error answers (`{"error": code, …}`).
    ErrorCode;
    /// Malformed input.
    BadRequest => "bad_request",
    /// Limits out of range.
    InvalidLimits => "invalid_limits",
    /// No valid key.
    Unauthorized => "unauthorized",
    /// Not allowed.
    Forbidden => "forbidden",
    /// A capability denied, with its reason.
    Deny => "deny",
    /// Nothing there (for this caller).
    NotFound => "not_found",
    /// In conflict with the state.
    Conflict => "conflict",
    /// No running execution.
    NotRunning => "not_running",
    /// Paused (a worker's answer while its sandbox is frozen).
    Paused => "paused",
    /// A stored snapshot that fails its digest.
    SnapshotCorrupt => "snapshot_corrupt",
    /// Over a size limit.
    TooLarge => "too_large",
    /// Over the tenant's sandbox quota.
    QuotaExceeded => "quota_exceeded",
    /// A transition outlasted the wait.
    Transitioning => "transitioning",
    /// Not available now.
    Unavailable => "unavailable",
    /// A stale route that could not be recovered.
    RouteUnavailable => "route_unavailable",
    /// A worker or control plane failed.
    BadGateway => "bad_gateway",
    /// An answer from another execution.
    WrongExecution => "wrong_execution",
    /// A credential bound to an execution the sandbox no longer runs.
    ExecutionReplaced => "execution_replaced",
    /// Our own failure.
    Internal => "internal",
    /// Not served by a standalone edge.
    NotHere => "not_here",
    /// The sandbox does not expose that service port.
    PortNotExposed => "port_not_exposed",
    /// No such account in the sandbox's `/etc/passwd` (exec, terminal, upload as a user).
    UnknownUser => "unknown_user",
    /// Nothing accepts connections on the service port inside the sandbox.
    PortClosed => "port_closed",
    /// A request on a service-port connection bound to another sandbox or port.
    Misdirected => "misdirected",
    /// A template live sandboxes are pinned to cannot be removed.
    TemplateInUse => "template_in_use",
}

impl ErrorCode {
    /// The code the edge passes on for `code`, read from another daemon's error
    /// answer: the codes a client of the edge may act on are kept, any other (or an
    /// unknown one) becomes `bad_gateway`. The one map for every relayed answer.
    pub fn relayed(code: &str) -> Self {
        const KEPT: [ErrorCode; 13] = [
            ErrorCode::BadRequest,
            ErrorCode::Unauthorized,
            ErrorCode::Forbidden,
            ErrorCode::Deny,
            ErrorCode::NotFound,
            ErrorCode::Conflict,
            ErrorCode::NotRunning,
            ErrorCode::Paused,
            ErrorCode::Transitioning,
            ErrorCode::PortNotExposed,
            ErrorCode::PortClosed,
            ErrorCode::Misdirected,
            ErrorCode::UnknownUser,
        ];
        KEPT.into_iter()
            .find(|c| c.as_str() == code)
            .unwrap_or(ErrorCode::BadGateway)
    }
}

codes! {
    /// The codes of node-api's error answers (`{"error": code, …}`), the worker's own:
    /// the edge reads them ([`ErrorCode::relayed`]) and passes on those a client acts on.
    WorkerCode;
    /// No capability, or one that does not parse.
    Unauthorized => "unauthorized",
    /// A capability denied, with its reason.
    Deny => "deny",
    /// A stale route: resolve the sandbox's route again (421).
    RefreshRoute => "refresh_route",
    /// The execution is paused.
    Paused => "paused",
    /// Nothing there.
    NotFound => "not_found",
    /// Malformed input.
    BadRequest => "bad_request",
    /// Over a size limit.
    TooLarge => "too_large",
    /// A body that did not arrive in time.
    BodyTimeout => "body_timeout",
    /// A body shorter than announced.
    IncompleteBody => "incomplete_body",
    /// A range that selects nothing.
    RangeNotSatisfiable => "range_not_satisfiable",
    /// The bridge to the sandbox failed.
    Bridge => "bridge",
    /// A key whose first answer cannot be replayed.
    ReplayUnavailable => "replay_unavailable",
    /// The answer was lost on the way back.
    AnswerFailed => "answer_failed",
    /// The worker's own failure.
    Internal => "internal",
    /// A control update refused.
    UpdateRefused => "update_refused",
    /// Nothing accepts connections on the service port inside the sandbox.
    PortClosed => "port_closed",
    /// A request on a service-port connection bound to another sandbox or port.
    Misdirected => "misdirected",
    /// This worker cannot do it (service ports on a rootless worker).
    Unsupported => "unsupported",
    /// The agent: permission denied.
    PermissionDenied => "permission_denied",
    /// The agent: a directory where a file was expected.
    IsADirectory => "is_a_directory",
    /// The agent: not a directory.
    NotADirectory => "not_a_directory",
    /// The agent: it exists already.
    AlreadyExists => "already_exists",
    /// The agent: an argument it refused.
    InvalidArgument => "invalid_argument",
    /// The agent: busy.
    Busy => "busy",
    /// The agent: no space left.
    NoSpace => "no_space",
    /// The agent: no such account in the sandbox.
    UnknownUser => "unknown_user",
    /// The agent: any other failure.
    Agent => "agent",
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_its_own_wire_form() {
        let mut seen = std::collections::BTreeSet::new();
        for c in ErrorCode::ALL {
            assert!(seen.insert(c.as_str()), "{c:?} repeats {}", c.as_str());
        }
    }

    #[test]
    fn a_relayed_answer_keeps_the_codes_a_client_acts_on_and_hides_the_rest() {
        for kept in [
            "bad_request",
            "unauthorized",
            "forbidden",
            "deny",
            "not_found",
            "conflict",
            "not_running",
            "paused",
            "transitioning",
        ] {
            assert_eq!(ErrorCode::relayed(kept).as_str(), kept);
        }
        for hidden in [
            "internal",
            "quota_exceeded",
            "refresh_route",
            "",
            "NOT_FOUND",
        ] {
            assert_eq!(
                ErrorCode::relayed(hidden),
                ErrorCode::BadGateway,
                "{hidden}"
            );
        }
    }

    #[test]
    fn every_worker_code_has_its_own_wire_form() {
        let mut seen = std::collections::BTreeSet::new();
        for c in WorkerCode::ALL {
            assert!(seen.insert(c.as_str()), "{c:?} repeats {}", c.as_str());
        }
    }
}
