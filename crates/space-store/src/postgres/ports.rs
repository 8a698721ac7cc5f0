//! Service ports and their one-time links. A write of several statements runs in one
//! transaction; taking a link is one statement, so two replicas racing for it cannot
//! both win.

use super::*;
use crate::records::PortRecord;

impl PgStore {
    /// See [`crate::Store::upsert_port`].
    pub async fn upsert_port(&self, p: &PortRecord) -> Result<bool, StoreError> {
        outcomes::check_port(p)?;
        let sbx = p.sandbox.to_string();
        let port = i64::from(p.port);
        let params: Params = &[
            &sbx,
            &port,
            &p.protocol,
            &p.public,
            &p.token_hash,
            &p.created_at,
        ];
        let mut c = self.pool.get().await?;
        let tx = c.client().transaction().await.map_err(pg_err)?;
        // Each statement sees what committed before it: when the row the insert found
        // is deleted before the update reaches it, the next insert creates it.
        let mut new = None;
        for _ in 0..outcomes::UPSERT_ATTEMPTS {
            if tx
                .execute(sql::port_table(p.port).insert, params)
                .await
                .map_err(pg_err)?
                == 1
            {
                new = Some(true);
                break;
            }
            if tx
                .execute(sql::port_table(p.port).replace, params)
                .await
                .map_err(pg_err)?
                == 1
            {
                new = Some(false);
                break;
            }
        }
        let new = new.ok_or_else(|| outcomes::upsert_gave_up(&sbx, p.port))?;
        tx.execute(sql::DELETE_PORT_LINKS_OF_PORT, &[&sbx, &port])
            .await
            .map_err(pg_err)?;
        tx.commit().await.map_err(pg_err)?;
        Ok(new)
    }

    /// See [`crate::Store::list_ports`].
    pub async fn list_ports(&self, sandbox: &SandboxId) -> Result<Vec<PortRecord>, StoreError> {
        let sbx = sandbox.to_string();
        self.all(sql::LIST_PORTS, &[&sbx], rows::port).await
    }

    /// See [`crate::Store::get_port`].
    pub async fn get_port(
        &self,
        sandbox: &SandboxId,
        port: u16,
    ) -> Result<Option<PortRecord>, StoreError> {
        let sbx = sandbox.to_string();
        let table = sql::port_table_name(port);
        let port = i64::from(port);
        let q = sql::select(
            rows::PORT_COLUMNS,
            table,
            "WHERE sandbox_id = $1 AND port = $2",
        );
        self.one(&q, &[&sbx, &port], rows::port).await
    }

    /// See [`crate::Store::delete_port`].
    pub async fn delete_port(&self, sandbox: &SandboxId, port: u16) -> Result<bool, StoreError> {
        let sbx = sandbox.to_string();
        let table = sql::port_table(port);
        let port = i64::from(port);
        let mut c = self.pool.get().await?;
        let tx = c.client().transaction().await.map_err(pg_err)?;
        tx.execute(sql::DELETE_PORT_LINKS_OF_PORT, &[&sbx, &port])
            .await
            .map_err(pg_err)?;
        let n = tx
            .execute(table.delete, &[&sbx, &port])
            .await
            .map_err(pg_err)?;
        tx.commit().await.map_err(pg_err)?;
        Ok(n > 0)
    }

    /// See [`crate::Store::delete_ports`].
    pub async fn delete_ports(&self, sandbox: &SandboxId) -> Result<u64, StoreError> {
        let sbx = sandbox.to_string();
        let mut c = self.pool.get().await?;
        let tx = c.client().transaction().await.map_err(pg_err)?;
        tx.execute(sql::DELETE_PORT_LINKS_OF_SANDBOX, &[&sbx])
            .await
            .map_err(pg_err)?;
        tx.execute(sql::EVERY_HTTP_PORTS.delete_all, &[&sbx])
            .await
            .map_err(pg_err)?;
        let n = tx
            .execute(sql::SERVICE_PORTS.delete_all, &[&sbx])
            .await
            .map_err(pg_err)?;
        tx.commit().await.map_err(pg_err)?;
        Ok(n)
    }

    /// See [`crate::Store::insert_port_link`].
    pub async fn insert_port_link(
        &self,
        code_hash: &str,
        sandbox: &SandboxId,
        port: u16,
        expires_at: i64,
    ) -> Result<(), StoreError> {
        outcomes::check_hash("link code hash", code_hash)?;
        outcomes::check_port_number(port)?;
        let sbx = sandbox.to_string();
        let port = i64::from(port);
        self.exec(
            sql::INSERT_PORT_LINK,
            &[&code_hash, &sbx, &port, &expires_at],
        )
        .await
        .map(drop)
    }

    /// See [`crate::Store::take_port_link`].
    pub async fn take_port_link(
        &self,
        code_hash: &str,
        now: i64,
    ) -> Result<Option<(SandboxId, u16)>, StoreError> {
        let taken = self
            .one(sql::TAKE_PORT_LINK, &[&code_hash], |r| {
                Ok((rows::link_target(r.text(0)?, r.int(1)?)?, r.int(2)?))
            })
            .await?;
        Ok(taken.and_then(|(target, expires_at)| outcomes::live_link(target, expires_at, now)))
    }

    /// See [`crate::Store::purge_port_links`].
    pub async fn purge_port_links(&self, now: i64) -> Result<u64, StoreError> {
        self.exec(sql::PURGE_PORT_LINKS, &[&now]).await
    }
}
