//! The connection pool of [`super::PgStore`].

use std::sync::{Mutex, PoisonError};

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_postgres::{Client, Config, NoTls};

use super::error::pg_err;
use crate::error::StoreError;

/// A few clients behind a semaphore: at most `size` connections, idle ones reused,
/// broken ones dropped and replaced on the next checkout.
#[derive(Debug)]
pub(super) struct Pool {
    pub(super) config: Config,
    pub(super) idle: Mutex<Vec<Client>>,
    pub(super) permits: Semaphore,
    /// The task holding the `LISTEN` connection (see [`listen`]); ends with the pool.
    pub(super) listener: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Some(l) = self
            .listener
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            l.abort();
        }
    }
}

/// A client checked out of the [`Pool`]; goes back on drop unless its connection died.
pub(super) struct PooledClient<'a> {
    pool: &'a Pool,
    client: Option<Client>,
    _permit: SemaphorePermit<'a>,
}

impl Pool {
    pub(super) async fn get(&self) -> Result<PooledClient<'_>, StoreError> {
        let permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| StoreError::Backend("connection pool closed".into()))?;
        let reused = loop {
            let next = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            match next {
                Some(c) if c.is_closed() => continue,
                other => break other,
            }
        };
        let client = match reused {
            Some(c) => c,
            None => self.connect().await?,
        };
        Ok(PooledClient {
            pool: self,
            client: Some(client),
            _permit: permit,
        })
    }

    async fn connect(&self) -> Result<Client, StoreError> {
        let (client, connection) = self.config.connect(NoTls).await.map_err(pg_err)?;
        // The connection future does the I/O; it ends when the client is dropped or the
        // server goes away, and `Client::is_closed` then tells the pool.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }
}

impl PooledClient<'_> {
    pub(super) fn client(&mut self) -> &mut Client {
        self.client
            .as_mut()
            .unwrap_or_else(|| unreachable!("the client is taken only on drop"))
    }
}

impl Drop for PooledClient<'_> {
    fn drop(&mut self) {
        match self.client.take() {
            Some(c) if !c.is_closed() => self
                .pool
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(c),
            _ => {}
        }
    }
}
