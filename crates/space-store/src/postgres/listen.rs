//! The `LISTEN` side of lifecycle notifications between replicas: a connection that
//! hands every `pg_notify` on [`LIFECYCLE_CHANNEL`] to [`crate::changes::notify`].

use std::time::Duration;

use space_identity::SandboxId;
use tokio_postgres::{Config, NoTls};

/// The channel lifecycle changes are announced on; the payload is the sandbox ID.
pub(super) const LIFECYCLE_CHANNEL: &str = "space_lifecycle";

/// Keeps a connection that `LISTEN`s on [`LIFECYCLE_CHANNEL`] and hands every
/// notification to [`crate::changes::notify`]: so a waiter in this process learns of a
/// transition another replica wrote. Reconnects after a second when it breaks (a
/// notification lost meanwhile costs a waiter its own deadline, nothing else).
pub(super) async fn listen(config: Config) {
    loop {
        if let Err(e) = listen_once(&config).await {
            // The store has no logger of its own; the daemon's stderr collects this.
            eprintln!("space-store: lifecycle LISTEN connection: {e}; reconnecting");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn listen_once(config: &Config) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = config.connect(NoTls).await?;
    let drive = async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                    if let Ok(id) = n.payload().parse::<SandboxId>() {
                        crate::changes::notify(&id);
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => return Ok(()),
            }
        }
    };
    let subscribe = async {
        client
            .batch_execute(&format!("LISTEN {LIFECYCLE_CHANNEL}"))
            .await?;
        std::future::pending::<Result<(), tokio_postgres::Error>>().await
    };
    tokio::select! {
        r = drive => r,
        r = subscribe => r,
    }
}
