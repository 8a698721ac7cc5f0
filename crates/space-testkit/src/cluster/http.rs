//! Blocking HTTP calls to a cluster's listeners, each on a tiny runtime of its own.

use std::time::Duration;

use bytes::Bytes;

/// How long a call may take unless a test says otherwise.
const CALL_LIMIT: Duration = Duration::from_secs(60);

/// Runs `call` to completion on a current-thread runtime.
fn block_on<T>(call: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
        .block_on(call)
}

/// One blocking HTTP call with a JSON content type and, when given, an
/// `authorization` header: its status and body.
pub fn http(method: &str, url: &str, auth: Option<&str>, body: &[u8]) -> (u16, Vec<u8>) {
    let mut headers = vec![("content-type", "application/json")];
    if let Some(a) = auth {
        headers.push(("authorization", a));
    }
    let method = method.parse().expect("an HTTP method");
    let a = block_on(space_http::HttpClient::new(CALL_LIMIT).call(
        method,
        url,
        &headers,
        Bytes::copy_from_slice(body),
    ))
    .expect("the call is answered");
    (a.status.as_u16(), a.body.to_vec())
}

/// A JSON POST with extra headers.
pub fn http_with(url: &str, auth: &str, body: &[u8], extra: &[(&str, &str)]) -> (u16, Vec<u8>) {
    let a = post_within(url, auth, body, extra, CALL_LIMIT).expect("the call is answered");
    (a.status.as_u16(), a.body.to_vec())
}

/// A JSON POST whose client gives up (and disconnects) after `limit`.
pub fn post_within(
    url: &str,
    auth: &str,
    body: &[u8],
    extra: &[(&str, &str)],
    limit: Duration,
) -> Result<space_http::Answer, space_http::CallError> {
    let mut headers = vec![
        ("content-type", "application/json"),
        ("authorization", auth),
    ];
    headers.extend_from_slice(extra);
    block_on(space_http::HttpClient::new(limit).call(
        hyper::Method::POST,
        url,
        &headers,
        Bytes::copy_from_slice(body),
    ))
}

/// POSTs `body` to a worker's `/internal/v1/updates` under the delivery header
/// `delivery` (see `Signer::delivery`).
pub fn post_delivered(url: &str, delivery: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let headers = [
        ("content-type", "application/json"),
        ("space-delivery", delivery),
    ];
    let a = block_on(space_http::HttpClient::new(CALL_LIMIT).call(
        hyper::Method::POST,
        url,
        &headers,
        Bytes::copy_from_slice(body),
    ))
    .expect("the call is answered");
    (a.status.as_u16(), a.body.to_vec())
}
