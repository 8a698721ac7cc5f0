//! The one form of every error the CLI reports, from the SDK's errors (printed by
//! `main` as `space: error: MESSAGE (CODE, HTTP STATUS)`).

use space_client::Error;

/// `e` as the CLI words it: an API error's message, then its code (and reason) and
/// the HTTP status; a body that was not an API error quoted (its first 512 bytes); a
/// platform that could not be reached named by `url`.
pub(crate) fn describe(e: &Error, url: &str) -> String {
    match e {
        Error::Api {
            status,
            code,
            message,
            reason,
        } => api_error(status.as_u16(), code, message, reason.as_deref()),
        Error::Transport(t) => format!("cannot reach {url}: {t}"),
        other => other.to_string(),
    }
}

/// An answer's error: `message (code[: reason], HTTP status)`. The SDK names an answer
/// whose body is no API error `http`, with the body as its message.
fn api_error(status: u16, code: &str, message: &str, reason: Option<&str>) -> String {
    if code == "http" {
        let text = String::from_utf8_lossy(&message.as_bytes()[..message.len().min(512)]);
        let text = text.trim();
        return if text.is_empty() {
            format!("the server answered HTTP {status} (HTTP {status})")
        } else {
            format!("{text} (HTTP {status})")
        };
    }
    match reason {
        Some(r) => format!("{message} ({code}: {r}, HTTP {status})"),
        None => format!("{message} ({code}, HTTP {status})"),
    }
}

/// A sandbox ID given on the command line that is not one: what the platform answers
/// for an ID it does not know.
pub(crate) fn no_such_sandbox() -> String {
    api_error(404, "not_found", "sandbox not found", None)
}

/// A worker ID given on the command line that is not one: what the platform answers
/// for a request naming it.
pub(crate) fn bad_worker(id: &str) -> String {
    api_error(
        400,
        "bad_request",
        &format!("invalid JSON body: invalid worker id {id:?}"),
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::StatusCode;

    fn api(status: u16, code: &str, message: &str, reason: Option<&str>) -> Error {
        Error::Api {
            status: StatusCode::from_u16(status).expect("a status"),
            code: code.into(),
            message: message.into(),
            reason: reason.map(str::to_owned),
        }
    }

    #[test]
    fn an_api_error_reads_message_code_reason_and_status() {
        let e = api(403, "deny", "denied", Some("expired"));
        assert_eq!(describe(&e, "u"), "denied (deny: expired, HTTP 403)");
        let e = api(404, "not_found", "sandbox not found", None);
        assert_eq!(describe(&e, "u"), "sandbox not found (not_found, HTTP 404)");
        assert_eq!(no_such_sandbox(), "sandbox not found (not_found, HTTP 404)");
    }

    #[test]
    fn an_answer_that_is_no_api_error_is_quoted_at_most_512_bytes() {
        let e = api(502, "http", "  upstream gone \n", None);
        assert_eq!(describe(&e, "u"), "upstream gone (HTTP 502)");
        let e = api(405, "http", "", None);
        assert_eq!(describe(&e, "u"), "the server answered HTTP 405 (HTTP 405)");
        let long = "x".repeat(600);
        let e = api(500, "http", &long, None);
        assert_eq!(describe(&e, "u"), format!("{} (HTTP 500)", "x".repeat(512)));
    }
}
