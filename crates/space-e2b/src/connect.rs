//! The Connect protocol (connectrpc.com/docs/protocol) as envd speaks it to the SDKs:
//! the JSON codec over HTTP/1.1, no compression.
//!
//! - **Unary**: `POST /{service}/{method}`, `Content-Type: application/json`, the
//!   request message as the body; the answer is `200 application/json` with the
//!   response message, or an error status with `{"code", "message"}`.
//! - **Server streaming**: `Content-Type: application/connect+json`, the body one
//!   *envelope* (a flags byte, a 4-byte big-endian length, the JSON message); the
//!   answer is `200 application/connect+json`, a sequence of envelopes, the last with
//!   flag `0x02` (end of stream) holding `{}` or `{"error": {"code", "message"}}`.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Largest request message read (a `SendInput` of stdin is the largest there is).
pub const MAX_MESSAGE: usize = 8 << 20;

/// Largest request body of every other call (paths, selectors, sizes).
pub const SMALL_MESSAGE: usize = 64 << 10;

/// Flag of the end-of-stream envelope.
const END_STREAM: u8 = 0x02;
/// Flag of a compressed envelope (never sent by the SDKs: refused).
const COMPRESSED: u8 = 0x01;

/// The Connect error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    /// The code's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Canceled => "canceled",
            Self::Unknown => "unknown",
            Self::InvalidArgument => "invalid_argument",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::NotFound => "not_found",
            Self::AlreadyExists => "already_exists",
            Self::PermissionDenied => "permission_denied",
            Self::ResourceExhausted => "resource_exhausted",
            Self::FailedPrecondition => "failed_precondition",
            Self::Aborted => "aborted",
            Self::OutOfRange => "out_of_range",
            Self::Unimplemented => "unimplemented",
            Self::Internal => "internal",
            Self::Unavailable => "unavailable",
            Self::DataLoss => "data_loss",
            Self::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error answer with this code (the protocol's table).
    pub fn status(self) -> StatusCode {
        match self {
            Self::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Self::Unknown | Self::Internal | Self::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
            Self::InvalidArgument | Self::FailedPrecondition | Self::OutOfRange => {
                StatusCode::BAD_REQUEST
            }
            Self::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::AlreadyExists | Self::Aborted => StatusCode::CONFLICT,
            Self::PermissionDenied => StatusCode::FORBIDDEN,
            Self::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Self::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Self::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// An RPC's failure, as the client reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    /// Its code.
    pub code: Code,
    /// What to tell the caller.
    pub message: String,
}

impl RpcError {
    /// An error with `code` and `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code.as_str(), "message": self.message})
    }
}

impl IntoResponse for RpcError {
    /// The unary form: the status of the code, the error as the JSON body.
    fn into_response(self) -> Response {
        let body = self.json().to_string();
        let mut resp = (self.code.status(), body).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        resp
    }
}

/// Whether the request is a streaming call (`application/connect+json`).
pub fn is_streaming(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().starts_with("application/connect+json"))
}

/// Whether the request is a unary JSON call.
pub fn is_unary_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let v = v.split(';').next().unwrap_or_default().trim();
            v.eq_ignore_ascii_case("application/json")
        })
}

/// The request message of a unary call (the whole body is the JSON message).
pub fn unary_request<T: DeserializeOwned>(headers: &HeaderMap, body: &[u8]) -> Result<T, RpcError> {
    if !is_unary_json(headers) {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "only the JSON codec is served: Content-Type must be application/json",
        ));
    }
    decode(if body.is_empty() { b"{}" } else { body })
}

/// The request message of a server-streaming call: exactly one envelope.
pub fn stream_request<T: DeserializeOwned>(body: &[u8]) -> Result<T, RpcError> {
    let (flags, message, rest) = split_envelope(body)?;
    if !rest.is_empty() {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "a server-streaming call takes exactly one request message",
        ));
    }
    if flags & COMPRESSED != 0 {
        return Err(RpcError::new(
            Code::Unimplemented,
            "compressed messages are not accepted",
        ));
    }
    decode(message)
}

/// The flags, the message and what follows it, of the envelope at the start of `buf`.
pub fn split_envelope(buf: &[u8]) -> Result<(u8, &[u8], &[u8]), RpcError> {
    if buf.len() < 5 {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "the request is not an enveloped message",
        ));
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if len > MAX_MESSAGE {
        return Err(RpcError::new(
            Code::ResourceExhausted,
            format!("a request message is at most {MAX_MESSAGE} bytes"),
        ));
    }
    let end = 5 + len;
    if buf.len() < end {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "the request message is cut short",
        ));
    }
    Ok((buf[0], &buf[5..end], &buf[end..]))
}

fn decode<T: DeserializeOwned>(json: &[u8]) -> Result<T, RpcError> {
    serde_json::from_slice(json).map_err(|e| {
        RpcError::new(
            Code::InvalidArgument,
            format!("invalid request message: {e}"),
        )
    })
}

/// One data envelope holding `message`.
pub fn envelope(message: &impl Serialize) -> Bytes {
    let json = serde_json::to_vec(message).unwrap_or_else(|_| b"{}".to_vec());
    frame(0, &json)
}

/// The end-of-stream envelope: `{}`, or the error.
pub fn end_stream(error: Option<&RpcError>) -> Bytes {
    let json = match error {
        None => serde_json::json!({}),
        Some(e) => serde_json::json!({"error": e.json()}),
    };
    frame(END_STREAM, json.to_string().as_bytes())
}

fn frame(flags: u8, json: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + json.len());
    b.put_u8(flags);
    b.put_u32(json.len() as u32);
    b.put_slice(json);
    b.freeze()
}

/// A unary answer holding `message`.
pub fn unary_response(message: &impl Serialize) -> Response {
    let body = serde_json::to_vec(message).unwrap_or_else(|_| b"{}".to_vec());
    let mut resp = (StatusCode::OK, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A streaming answer whose body is `body` (envelopes ending with [`end_stream`]).
pub fn stream_response(body: Body) -> Response {
    let mut resp = (StatusCode::OK, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/connect+json"),
    );
    resp
}

/// A streaming call that failed before its first message: the error as the end of
/// an otherwise empty stream (status 200, as the protocol has it).
pub fn stream_error(e: &RpcError) -> Response {
    stream_response(Body::from(end_stream(Some(e))))
}

/// `e` in the form of the call: a unary error answer, or a stream that ends with it.
pub fn failure(streaming: bool, e: &RpcError) -> Response {
    if streaming {
        stream_error(e)
    } else {
        e.clone().into_response()
    }
}

/// The deadline the client set (`Connect-Timeout-Ms`), if any.
pub fn timeout(headers: &HeaderMap) -> Option<std::time::Duration> {
    headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(std::time::Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_round_trips_and_the_end_of_stream_carries_the_error() {
        let e = envelope(&serde_json::json!({"a": 1}));
        let (flags, msg, rest) = split_envelope(&e).unwrap();
        assert_eq!((flags, msg, rest), (0, &b"{\"a\":1}"[..], &b""[..]));
        let end = end_stream(Some(&RpcError::new(Code::NotFound, "gone")));
        let (flags, msg, _) = split_envelope(&end).unwrap();
        assert_eq!(flags, END_STREAM);
        let v: serde_json::Value = serde_json::from_slice(msg).unwrap();
        assert_eq!(v["error"]["code"], "not_found");
        assert_eq!(v["error"]["message"], "gone");
    }

    #[test]
    fn a_stream_request_must_be_one_whole_uncompressed_envelope_within_the_bound() {
        let one = envelope(&serde_json::json!({"x": "y"}));
        let v: serde_json::Value = stream_request(&one).unwrap();
        assert_eq!(v["x"], "y");
        let two = [one.as_ref(), one.as_ref()].concat();
        assert!(stream_request::<serde_json::Value>(&two).is_err());
        assert!(stream_request::<serde_json::Value>(&one[..one.len() - 1]).is_err());
        let mut compressed = one.to_vec();
        compressed[0] = COMPRESSED;
        assert_eq!(
            stream_request::<serde_json::Value>(&compressed)
                .unwrap_err()
                .code,
            Code::Unimplemented
        );
        let mut huge = vec![0u8, 0, 0, 0, 0];
        huge[1..5].copy_from_slice(&((MAX_MESSAGE + 1) as u32).to_be_bytes());
        assert_eq!(
            split_envelope(&huge).unwrap_err().code,
            Code::ResourceExhausted
        );
    }

    #[test]
    fn unary_errors_take_the_protocols_status() {
        assert_eq!(Code::NotFound.status(), StatusCode::NOT_FOUND);
        assert_eq!(Code::Unauthenticated.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(Code::AlreadyExists.status(), StatusCode::CONFLICT);
        assert_eq!(Code::Canceled.status().as_u16(), 499);
    }
}
