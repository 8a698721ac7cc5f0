//! The edge's WebSocket streams: the client's socket is relayed to a backend socket
//! opened on the worker the route names, with the route driver's recovery for the open
//! as for any request (RefreshRoute → one coalesced resolve → one rebuilt attempt;
//! Deny surfaced; a worker refusing connections waited for).
//! A backend that ends the stream (4001 "execution replaced" when the worker installed
//! another execution) ends the client's too: a terminal never reattaches to a new
//! shell behind the client's back.

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use axum::http::StatusCode;
use futures_util::{SinkExt, StreamExt};
use space_identity::{OperationClass, Progress, SandboxId};
use space_proto::api::ErrorBody;
use space_route::Attempt;
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest};

use super::routes::{deny_reason, relayed};
use super::{Authenticated, Edge};
use crate::error::ControlError;

/// A backend socket: a WebSocket to the worker.
pub type Backend =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

impl Edge {
    /// Opens the backend socket of a stream for `sandbox` at `path_and_query`, with
    /// the route driver's recovery (a refused upgrade is an answer like any other).
    pub async fn open_stream(
        &self,
        who: &Authenticated,
        sandbox: &SandboxId,
        path_and_query: &str,
    ) -> Result<Backend, ControlError> {
        self.open_stream_to(who, sandbox, None, path_and_query)
            .await
    }

    /// [`Edge::open_stream`] on execution `pinned` only (`None`: whichever serves
    /// the sandbox): see [`Edge::drive_pinned`].
    pub async fn open_stream_to(
        &self,
        who: &Authenticated,
        sandbox: &SandboxId,
        pinned: Option<&space_identity::ExecutionId>,
        path_and_query: &str,
    ) -> Result<Backend, ControlError> {
        self.drive_pinned(
            who,
            sandbox,
            pinned,
            OperationClass::StreamOpen,
            |_, grant| async move {
                let url = format!(
                    "{}{}",
                    grant.worker_url.replacen("http", "ws", 1),
                    path_and_query
                );
                let mut req = match url.into_client_request() {
                    Ok(r) => r,
                    Err(e) => {
                        return Attempt::Done(Err(ControlError::BadGateway(format!(
                            "worker url: {e}"
                        ))));
                    }
                };
                let Ok(auth) = grant.authorization.parse() else {
                    return Attempt::Done(Err(ControlError::Internal(
                        "capability is not a header value".into(),
                    )));
                };
                req.headers_mut().insert("authorization", auth);
                match tokio_tungstenite::connect_async(req).await {
                    Ok((socket, _)) => Attempt::Done(Ok(socket)),
                    Err(tungstenite::Error::Http(resp)) => {
                        let status = resp.status();
                        let body: Option<ErrorBody> = resp
                            .body()
                            .as_ref()
                            .and_then(|b| serde_json::from_slice(b).ok());
                        match status {
                            StatusCode::MISDIRECTED_REQUEST => Attempt::RefreshRoute {
                                reason: space_proto::api::refresh_reason(body.as_ref()),
                                answer: relayed(status.as_u16(), body),
                            },
                            StatusCode::FORBIDDEN => Attempt::Denied {
                                reason: deny_reason(body.as_ref()),
                                answer: Err(relayed(status.as_u16(), body)),
                            },
                            _ => Attempt::Done(Err(relayed(status.as_u16(), body))),
                        }
                    }
                    Err(e) => Attempt::Failed {
                        // A refused connection: nothing reached the worker (it is
                        // restarting, say).
                        progress: match &e {
                            tungstenite::Error::Io(io)
                                if io.kind() == std::io::ErrorKind::ConnectionRefused =>
                            {
                                Progress::NotStarted
                            }
                            _ => Progress::Started,
                        },
                        error: ControlError::BadGateway(format!("worker stream: {e}")),
                    },
                }
            },
        )
        .await
    }
}

fn to_backend(m: Message) -> Option<tungstenite::Message> {
    Some(match m {
        Message::Text(t) => tungstenite::Message::Text(t.as_str().into()),
        Message::Binary(b) => tungstenite::Message::Binary(b),
        Message::Ping(b) => tungstenite::Message::Ping(b),
        Message::Pong(b) => tungstenite::Message::Pong(b),
        Message::Close(c) => {
            tungstenite::Message::Close(c.map(|c| tungstenite::protocol::CloseFrame {
                code: c.code.into(),
                reason: c.reason.as_str().into(),
            }))
        }
    })
}

fn to_client(m: tungstenite::Message) -> Option<Message> {
    Some(match m {
        tungstenite::Message::Text(t) => Message::Text(t.as_str().into()),
        tungstenite::Message::Binary(b) => Message::Binary(b),
        tungstenite::Message::Ping(b) => Message::Ping(b),
        tungstenite::Message::Pong(b) => Message::Pong(b),
        tungstenite::Message::Close(c) => Message::Close(c.map(|c| CloseFrame {
            code: c.code.into(),
            reason: Utf8Bytes::from(c.reason.as_str()),
        })),
        tungstenite::Message::Frame(_) => return None,
    })
}

/// What a client stream may do when its backend is replaced.
#[derive(Debug, Clone)]
pub struct Resubscribe {
    /// The edge, to open a new backend through the full checks.
    pub edge: std::sync::Arc<Edge>,
    /// The caller, as authenticated when the stream opened (with its key: the
    /// authorization is checked again on the re-open).
    pub caller: Authenticated,
    /// The sandbox.
    pub sandbox: SandboxId,
    /// The backend path and query.
    pub path_and_query: String,
}

/// Relays messages both ways until either side closes. When the backend ends with
/// 4001 (its execution was replaced) and `resubscribe` is given — a watch, or a
/// terminal whose client asked for `reattach=true` — a new backend is opened on the
/// current execution, admitted again in full, and the client is told with a text
/// message `{"type":"resubscribed"}`; nothing of the old backend follows it. Any other
/// backend end is passed on to the client with its code and reason.
pub async fn relay(client: WebSocket, backend: Backend, resubscribe: Option<Resubscribe>) {
    let (mut client_tx, mut client_rx) = client.split();
    let mut backend = backend;
    loop {
        let (mut backend_tx, mut backend_rx) = backend.split();
        // Both directions at once: a send that waits (the backend slow to take input)
        // must not stop output the other way, or a command that echoes its stdin
        // (`cat`) stops both (each side waiting for the other to read).
        let up = async {
            loop {
                match client_rx.next().await {
                    Some(Ok(m)) => {
                        let closing = matches!(m, Message::Close(_));
                        if let Some(m) = to_backend(m) {
                            if backend_tx.send(m).await.is_err() || closing {
                                return;
                            }
                        }
                    }
                    _ => {
                        let _ = backend_tx.close().await;
                        return;
                    }
                }
            }
        };
        let down = async {
            loop {
                match backend_rx.next().await {
                    Some(Ok(tungstenite::Message::Close(frame))) => break Some(frame),
                    Some(Ok(m)) => {
                        if let Some(m) = to_client(m) {
                            if client_tx.send(m).await.is_err() {
                                return None;
                            }
                        }
                    }
                    _ => break Some(None),
                }
            }
        };
        let ended: Option<tungstenite::protocol::CloseFrame> = tokio::select! {
            () = up => return,
            d = down => match d {
                Some(frame) => frame,
                None => return,
            },
        };
        let replaced = ended.as_ref().is_some_and(|f| u16::from(f.code) == 4001);
        if let (true, Some(r)) = (replaced, &resubscribe) {
            // The old backend is gone before the new one is asked for: no output of
            // the replaced execution can follow.
            match r
                .edge
                .open_stream(&r.caller, &r.sandbox, &r.path_and_query)
                .await
            {
                Ok(next) => {
                    backend = next;
                    let note = Message::Text(Utf8Bytes::from_static(r#"{"type":"resubscribed"}"#));
                    if client_tx.send(note).await.is_err() {
                        return;
                    }
                    continue;
                }
                Err(e) => {
                    let _ = client_tx
                        .send(Message::Close(Some(CloseFrame {
                            code: 4001,
                            reason: Utf8Bytes::from(format!(
                                "execution replaced; re-open failed: {}",
                                e
                            )),
                        })))
                        .await;
                    return;
                }
            }
        }
        let frame = ended.map_or(
            CloseFrame {
                code: 4002,
                reason: Utf8Bytes::from_static("backend connection ended"),
            },
            |f| CloseFrame {
                code: f.code.into(),
                reason: Utf8Bytes::from(f.reason.as_str()),
            },
        );
        let _ = client_tx.send(Message::Close(Some(frame))).await;
        return;
    }
}
