//! P13: E2B's `commands.run("true")` and a 4 KiB `files.read` through the E2B front
//! (`/process.Process/Start`, `GET /files`, with the access token), against the same
//! through SPACE's own API at the edge (`POST …/exec`, `GET …/files`, with the API
//! key), in one run on one platform: sequential p50 of each, one client (the same
//! HTTP client for both), the same sandbox. The command is what the SDK sends:
//! `/bin/bash -l -c true`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::Method;

use super::platform::{Platform, PlatformOptions};
use super::row::{Row, quantile};

/// Calls timed on each path (after [`WARMUP`] not timed).
const CALLS: usize = 300;
const WARMUP: usize = 30;
/// The file read.
const FILE: &str = "/tmp/p13-4k.bin";

/// Sorted times (ms) of `CALLS` runs of `call`.
async fn timed<F, Fut>(mut call: F) -> Result<Vec<f64>, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    for _ in 0..WARMUP {
        call().await?;
    }
    let mut out = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let t = Instant::now();
        call().await?;
        out.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    out.sort_by(f64::total_cmp);
    Ok(out)
}

/// One Connect envelope holding `json`.
fn envelope(json: &serde_json::Value) -> Bytes {
    let body = json.to_string().into_bytes();
    let mut out = Vec::with_capacity(5 + body.len());
    out.push(0);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Bytes::from(out)
}

/// Runs P13 on a platform of its own (one worker).
pub async fn run() -> Result<Vec<Row>, String> {
    eprintln!("P13: starting space up (1 worker)");
    let p = Platform::start(PlatformOptions {
        workers: 1,
        ..PlatformOptions::default()
    })
    .await?;
    let r = measure(&p).await;
    p.stop().await;
    r
}

async fn measure(p: &Platform) -> Result<Vec<Row>, String> {
    let http = space_http::HttpClient::new(Duration::from_secs(60));
    let admin = format!("Bearer {}", p.admin_key);
    let call = |method: Method, path: String, headers: Vec<(String, String)>, body: Bytes| {
        let http = &http;
        let url = format!("{}{path}", p.url);
        async move {
            let h: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            http.call(method, &url, &h, body)
                .await
                .map_err(|e| format!("{url}: {e}"))
        }
    };
    let a = call(
        Method::POST,
        "/v1/keys".into(),
        vec![
            ("authorization".into(), admin.clone()),
            ("content-type".into(), "application/json".into()),
        ],
        Bytes::from_static(br#"{"format": "e2b"}"#),
    )
    .await?;
    let key: serde_json::Value =
        serde_json::from_slice(&a.body).map_err(|e| format!("key: {e}"))?;
    let key = key["api_key"].as_str().ok_or("no e2b key")?.to_owned();
    let a = call(
        Method::POST,
        "/v2/sandboxes".into(),
        vec![
            ("x-api-key".into(), key.clone()),
            ("content-type".into(), "application/json".into()),
        ],
        Bytes::from_static(br#"{"templateID": "base", "timeout": 3600}"#),
    )
    .await?;
    if a.status.as_u16() != 201 {
        return Err(format!(
            "E2B create: {} {}",
            a.status,
            String::from_utf8_lossy(&a.body)
        ));
    }
    let created: serde_json::Value =
        serde_json::from_slice(&a.body).map_err(|e| format!("create: {e}"))?;
    let id = created["sandboxID"]
        .as_str()
        .ok_or("no sandboxID")?
        .to_owned();
    let token = created["envdAccessToken"]
        .as_str()
        .ok_or("no token")?
        .to_owned();
    let envd = vec![
        ("e2b-sandbox-id".to_owned(), id.clone()),
        ("e2b-sandbox-port".to_owned(), "49983".to_owned()),
        ("x-access-token".to_owned(), token),
    ];
    // The file both paths read.
    let a = call(
        Method::PUT,
        format!("/v1/sandboxes/{id}/files?path={FILE}"),
        vec![
            ("authorization".into(), admin.clone()),
            ("content-type".into(), "application/octet-stream".into()),
        ],
        Bytes::from(vec![7u8; 4096]),
    )
    .await?;
    if !a.status.is_success() {
        return Err(format!("put: {}", a.status));
    }
    eprintln!("P13: commands.run(\"true\") through the E2B front");
    let start = envelope(&serde_json::json!({
        "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "true"]},
        "stdin": false
    }));
    let mut stream_headers = envd.clone();
    stream_headers.push(("content-type".into(), "application/connect+json".into()));
    stream_headers.push(("connect-protocol-version".into(), "1".into()));
    let e2b_run = timed(|| {
        let (h, b) = (stream_headers.clone(), start.clone());
        let c = &call;
        async move {
            let a = c(Method::POST, "/process.Process/Start".into(), h, b).await?;
            // The end event, then the end of the stream: the command ran to its end.
            let text = String::from_utf8_lossy(&a.body);
            if a.status.as_u16() != 200 || !text.contains("\"end\"") || text.contains("\"error\"") {
                return Err(format!("Start: {} {text}", a.status));
            }
            Ok(())
        }
    })
    .await?;
    eprintln!("P13: the same through SPACE's own API");
    let exec = Bytes::from_static(br#"{"cmd": ["/bin/bash", "-l", "-c", "true"]}"#);
    let own_headers = vec![
        ("authorization".to_owned(), admin.clone()),
        ("content-type".to_owned(), "application/json".to_owned()),
    ];
    let own_run = timed(|| {
        let (h, b) = (own_headers.clone(), exec.clone());
        let c = &call;
        let path = format!("/v1/sandboxes/{id}/exec");
        async move {
            let a = c(Method::POST, path, h, b).await?;
            if a.status.as_u16() != 200
                || !String::from_utf8_lossy(&a.body).contains("\"exit_code\":0")
            {
                return Err(format!(
                    "exec: {} {}",
                    a.status,
                    String::from_utf8_lossy(&a.body)
                ));
            }
            Ok(())
        }
    })
    .await?;
    eprintln!("P13: the same through SPACE's own streaming exec (for information)");
    let ws_url = format!(
        "{}/v1/sandboxes/{id}/exec/stream",
        p.url.replacen("http", "ws", 1)
    );
    let own_stream = timed(|| {
        let (url, auth) = (ws_url.clone(), admin.clone());
        async move { own_stream_exec(&url, &auth).await }
    })
    .await?;
    eprintln!("P13: a 4 KiB files.read through the E2B front, then SPACE's own API");
    let e2b_read = timed(|| {
        let h = envd.clone();
        let c = &call;
        async move {
            let a = c(Method::GET, format!("/files?path={FILE}"), h, Bytes::new()).await?;
            if a.status.as_u16() != 200 || a.body.len() != 4096 {
                return Err(format!("files.read: {} {} bytes", a.status, a.body.len()));
            }
            Ok(())
        }
    })
    .await?;
    let own_read = timed(|| {
        let h = vec![("authorization".to_owned(), admin.clone())];
        let c = &call;
        let path = format!("/v1/sandboxes/{id}/files?path={FILE}");
        async move {
            let a = c(Method::GET, path, h, Bytes::new()).await?;
            if a.status.as_u16() != 200 || a.body.len() != 4096 {
                return Err(format!("read: {} {} bytes", a.status, a.body.len()));
            }
            Ok(())
        }
    })
    .await?;
    let row = |what: &str, e2b: &[f64], own: &[f64]| {
        let (pe, po) = (quantile(e2b, 0.5), quantile(own, 0.5));
        let ratio = pe / po;
        Row::new(
            "P13",
            what,
            format!(
                "p50 {pe:.3} ms (p99 {:.3}) vs own API p50 {po:.3} ms (p99 {:.3})",
                quantile(e2b, 0.99),
                quantile(own, 0.99)
            ),
            "p50 ≤ 1.5 × SPACE's own API",
        )
        .ratio(ratio)
        .pass(ratio <= 1.5)
    };
    let stream_p50 = quantile(&own_stream, 0.5);
    Ok(vec![
        row(
            "E2B commands.run(\"true\") vs POST …/exec",
            &e2b_run,
            &own_run,
        ),
        Row::new(
            "P13",
            "(information) SPACE's own streaming exec of the same",
            format!(
                "p50 {stream_p50:.3} ms (p99 {:.3}); the E2B front / it: {:.2}",
                quantile(&own_stream, 0.99),
                quantile(&e2b_run, 0.5) / stream_p50
            ),
            "-",
        ),
        row("E2B files.read 4 KiB vs GET …/files", &e2b_read, &own_read),
    ])
}

/// One `GET …/exec/stream` of `bash -l -c true` through the edge, to its close.
async fn own_stream_exec(url: &str, auth: &str) -> Result<(), String> {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};
    let mut req = url.into_client_request().map_err(|e| e.to_string())?;
    req.headers_mut()
        .insert("authorization", auth.parse().map_err(|_| "auth header")?);
    let (mut ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .map_err(|e| format!("exec stream: {e}"))?;
    ws.send(Message::Text(
        r#"{"cmd": ["/bin/bash", "-l", "-c", "true"], "stdin": ""}"#.into(),
    ))
    .await
    .map_err(|e| e.to_string())?;
    while let Some(m) = ws.next().await {
        match m.map_err(|e| e.to_string())? {
            Message::Close(Some(c)) if c.reason.as_str() == "exited 0" => return Ok(()),
            Message::Close(c) => return Err(format!("exec stream closed: {c:?}")),
            _ => {}
        }
    }
    Err("exec stream ended without a close".into())
}
