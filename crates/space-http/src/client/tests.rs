use super::*;
use crate::serve_until;
use hyper::StatusCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// How the test server treats each connection after reading one request.
#[derive(Clone, Copy)]
enum Serve {
    /// Answers every request, keeping the connection open.
    KeepAlive,
    /// Answers one request, then closes (without saying so).
    CloseAfterOne,
    /// Answers with `Connection: close`, then closes.
    SaysClose,
    /// Reads the request, then closes without answering.
    Hangup,
    /// Reads the request and never answers.
    Silent,
}

/// A raw HTTP/1.1 server on an ephemeral port; counts accepted connections and
/// requests read.
async fn server(mode: Serve) -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (accepts, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (a, r) = (Arc::clone(&accepts), Arc::clone(&requests));
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            a.fetch_add(1, Ordering::SeqCst);
            let r = Arc::clone(&r);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let mut chunk = [0u8; 1024];
                    let n = tcp.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    buf.drain(..end + 4);
                    r.fetch_add(1, Ordering::SeqCst);
                    let answer: &[u8] = match mode {
                        Serve::SaysClose => {
                            b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"
                        }
                        Serve::Hangup => return,
                        Serve::Silent => {
                            tokio::time::sleep(Duration::from_secs(60)).await;
                            return;
                        }
                        _ => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
                    };
                    if tcp.write_all(answer).await.is_err() {
                        return;
                    }
                    if matches!(mode, Serve::CloseAfterOne | Serve::SaysClose) {
                        return;
                    }
                }
            });
        }
    });
    (url, accepts, requests)
}

async fn get(c: &HttpClient, url: &str) -> Result<Answer, CallError> {
    c.call(
        Method::GET,
        &format!("{url}/x"),
        &[("a", "b")],
        Bytes::new(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_reuse_one_connection() {
    let (url, accepts, _) = server(Serve::KeepAlive).await;
    let c = HttpClient::new(Duration::from_secs(5));
    for _ in 0..50 {
        let a = get(&c, &url).await.unwrap();
        assert_eq!((a.status, &a.body[..]), (StatusCode::OK, &b"ok"[..]));
    }
    assert_eq!(accepts.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_the_peer_closed_is_replaced() {
    let (url, accepts, requests) = server(Serve::CloseAfterOne).await;
    let c = HttpClient::new(Duration::from_secs(5));
    for _ in 0..5 {
        assert_eq!(get(&c, &url).await.unwrap().status, StatusCode::OK);
        // Let the close arrive before the next call takes the connection.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(accepts.load(Ordering::SeqCst), 5);
    assert_eq!(requests.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn connection_close_is_not_pooled() {
    let (url, accepts, _) = server(Serve::SaysClose).await;
    let c = HttpClient::new(Duration::from_secs(5));
    for _ in 0..3 {
        assert_eq!(get(&c, &url).await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(accepts.load(Ordering::SeqCst), 3);
    assert!(c.checkout(url.trim_start_matches("http://")).is_none());
}

#[tokio::test]
async fn a_request_the_peer_read_is_never_sent_twice() {
    let (url, accepts, requests) = server(Serve::Hangup).await;
    let c = HttpClient::new(Duration::from_secs(5));
    assert!(matches!(get(&c, &url).await, Err(CallError::Transport(_))));
    assert_eq!(requests.load(Ordering::SeqCst), 1);
    assert_eq!(accepts.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn nothing_listening_is_a_connect_error_and_bad_urls_are_refused() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    let c = HttpClient::new(Duration::from_secs(5));
    assert!(matches!(get(&c, &url).await, Err(CallError::Connect(_))));
    for bad in ["not a url", "https://127.0.0.1:1/x", "/relative"] {
        let r = c.call(Method::GET, bad, &[], Bytes::new()).await;
        assert!(matches!(r, Err(CallError::Url(_))), "{bad}");
    }
}

#[tokio::test]
async fn connections_to_a_peer_gone_quiet_are_closed_on_later_use() {
    let (gone, gone_accepts, _) = server(Serve::KeepAlive).await;
    let (busy, _, _) = server(Serve::KeepAlive).await;
    let mut c = HttpClient::new(Duration::from_secs(5));
    c.idle_for = Duration::from_millis(100);
    assert_eq!(get(&c, &gone).await.unwrap().status, StatusCode::OK);
    assert_eq!(c.idle_count(), 1);
    tokio::time::sleep(Duration::from_millis(150)).await;
    // A call to another peer sweeps the first one's stale connection.
    assert_eq!(get(&c, &busy).await.unwrap().status, StatusCode::OK);
    assert_eq!(c.idle_count(), 1);
    // And a stale connection is never reused: a new one is made.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(get(&c, &gone).await.unwrap().status, StatusCode::OK);
    assert_eq!(gone_accepts.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_silent_peer_times_out() {
    let (url, _, _) = server(Serve::Silent).await;
    let c = HttpClient::new(Duration::from_millis(200));
    assert!(matches!(get(&c, &url).await, Err(CallError::Timeout)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_each_get_their_own_answer() {
    let app = axum::Router::new().route(
        "/echo/{n}",
        axum::routing::get(
            |axum::extract::Path(n): axum::extract::Path<u32>| async move { n.to_string() },
        ),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_until(listener, app, async {
        let _ = stopped.await;
    }));
    let c = HttpClient::new(Duration::from_secs(5));
    let tasks: Vec<_> = (0..32u32)
        .map(|i| {
            let (c, url) = (c.clone(), url.clone());
            tokio::spawn(async move {
                for j in 0..20u32 {
                    let n = i * 100 + j;
                    let a = c
                        .call(Method::GET, &format!("{url}/echo/{n}"), &[], Bytes::new())
                        .await
                        .unwrap();
                    assert_eq!(a.status, StatusCode::OK);
                    assert_eq!(a.body, n.to_string().into_bytes());
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_body_streams_out_and_an_answer_spools_to_a_sink_within_its_limit() {
    use std::io::Write as _;
    let app = axum::Router::new()
        .route(
            "/echo",
            axum::routing::post(|body: Bytes| async move { body }),
        )
        .layer(axum::extract::DefaultBodyLimit::disable());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/echo", listener.local_addr().unwrap());
    tokio::spawn(serve_until(listener, app, std::future::pending()));
    let data: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8).collect();
    let mut f = tempfile_for_test();
    f.write_all(&data).unwrap();
    let c = HttpClient::new(Duration::from_secs(10));
    let a = c
        .call_with_file(
            Method::POST,
            &url,
            &[],
            f.try_clone().unwrap(),
            data.len() as u64,
        )
        .await
        .unwrap();
    assert_eq!(a.status, StatusCode::OK);
    assert!(
        a.body == data,
        "the file did not arrive intact: {} of {}",
        a.body.len(),
        data.len()
    );
    // A file shorter than announced fails the call rather than sending garbage.
    let short = c
        .call_with_file(
            Method::POST,
            &url,
            &[],
            f.try_clone().unwrap(),
            data.len() as u64 + 1,
        )
        .await;
    assert!(short.is_err());
    // Spooled within the limit: every byte reaches the sink.
    let (a, spooled) = c
        .call_to_sink(
            Method::POST,
            &url,
            &[],
            Bytes::from(data.clone()),
            3 << 20,
            Vec::new(),
        )
        .await
        .unwrap();
    assert_eq!(a.status, StatusCode::OK);
    let (sink, n) = spooled.unwrap();
    assert_eq!((n, sink == data), (data.len() as u64, true));
    // Past it: refused, and at most the limit was written.
    let over = c
        .call_to_sink(
            Method::POST,
            &url,
            &[],
            Bytes::from(data.clone()),
            1 << 20,
            Vec::new(),
        )
        .await;
    assert!(
        matches!(over, Err(CallError::Transport(ref e)) if e.contains("limit")),
        "{over:?}"
    );
}

fn tempfile_for_test() -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc_o_tmpfile())
        .open(std::env::temp_dir())
        .unwrap()
}

/// `O_TMPFILE` on Linux (x86_64 and aarch64).
fn libc_o_tmpfile() -> i32 {
    0o20_000_000 | 0o200_000
}
