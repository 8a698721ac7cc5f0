//! Service ports and their one-time links. Every write runs on the writer thread, in
//! its own savepoint, so each one's statements apply whole or not at all.

use super::*;
use crate::records::PortRecord;

impl SqliteStore {
    /// See [`crate::Store::upsert_port`].
    pub async fn upsert_port(&self, p: &PortRecord) -> Result<bool, StoreError> {
        outcomes::check_port(p)?;
        let p = p.clone();
        self.call(move |c| {
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
            // The group holds SQLite's write lock: nothing can delete the row between
            // the insert that found it and the update that replaces it.
            let new = exec(c, sql::port_table(p.port).insert, params)? == 1;
            if !new {
                one_row(exec(c, sql::port_table(p.port).replace, params)?, || {
                    format!("port {port} of sandbox {sbx}")
                })?;
            }
            exec(c, sql::DELETE_PORT_LINKS_OF_PORT, &[&sbx, &port])?;
            Ok(new)
        })
        .await
    }

    /// See [`crate::Store::list_ports`].
    pub async fn list_ports(&self, sandbox: &SandboxId) -> Result<Vec<PortRecord>, StoreError> {
        let sbx = sandbox.to_string();
        self.read(move |c| query_all(c, sql::LIST_PORTS, &[&sbx], |r| rows::port(r)))
            .await
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
        self.read(move |c| {
            let q = sql::select(
                rows::PORT_COLUMNS,
                table,
                "WHERE sandbox_id = $1 AND port = $2",
            );
            query_one(c, &q, &[&sbx, &port], |r| rows::port(r))
        })
        .await
    }

    /// See [`crate::Store::delete_port`].
    pub async fn delete_port(&self, sandbox: &SandboxId, port: u16) -> Result<bool, StoreError> {
        let sbx = sandbox.to_string();
        let table = sql::port_table(port);
        let port = i64::from(port);
        self.call(move |c| {
            exec(c, sql::DELETE_PORT_LINKS_OF_PORT, &[&sbx, &port])?;
            Ok(exec(c, table.delete, &[&sbx, &port])? > 0)
        })
        .await
    }

    /// See [`crate::Store::delete_ports`].
    pub async fn delete_ports(&self, sandbox: &SandboxId) -> Result<u64, StoreError> {
        let sbx = sandbox.to_string();
        self.call(move |c| {
            exec(c, sql::DELETE_PORT_LINKS_OF_SANDBOX, &[&sbx])?;
            exec(c, sql::EVERY_HTTP_PORTS.delete_all, &[&sbx])?;
            exec(c, sql::SERVICE_PORTS.delete_all, &[&sbx])
        })
        .await
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
        let (code, sbx, port) = (code_hash.to_owned(), sandbox.to_string(), i64::from(port));
        self.call(move |c| {
            exec(c, sql::INSERT_PORT_LINK, &[&code, &sbx, &port, &expires_at]).map(drop)
        })
        .await
    }

    /// See [`crate::Store::take_port_link`].
    pub async fn take_port_link(
        &self,
        code_hash: &str,
        now: i64,
    ) -> Result<Option<(SandboxId, u16)>, StoreError> {
        let code = code_hash.to_owned();
        self.call(move |c| {
            let taken = query_one(c, sql::TAKE_PORT_LINK, &[&code], |r| {
                Ok((rows::link_target(r.text(0)?, r.int(1)?)?, r.int(2)?))
            })?;
            Ok(taken.and_then(|(target, expires_at)| outcomes::live_link(target, expires_at, now)))
        })
        .await
    }

    /// See [`crate::Store::purge_port_links`].
    pub async fn purge_port_links(&self, now: i64) -> Result<u64, StoreError> {
        self.call(move |c| exec(c, sql::PURGE_PORT_LINKS, &[&now]))
            .await
    }
}
