//! The client commands: sandboxes, exec, files, workers, keys.

use std::io::{Read, Write};
use std::time::Duration;

use bytes::Bytes;
use hyper::Method;
use space_http::{Answer, HttpClient};
use space_proto::api::{ErrorBody, ExecResponse, FileEntry, MAX_EXEC_STDIN, Sandbox, WorkerView};

use crate::{Cli, Command, FsCmd, KeysCmd, SandboxCmd};

struct Client {
    http: HttpClient,
    base: String,
    auth: String,
}

impl Client {
    fn new(cli: &Cli) -> Result<Self, String> {
        let key = match &cli.api_key {
            Some(k) => k.clone(),
            None => std::fs::read_to_string(".space/admin.key")
                .map(|s| s.trim().to_owned())
                .map_err(|_| "no API key: set SPACE_API_KEY or --api-key (space up writes one to .space/admin.key)".to_owned())?,
        };
        Ok(Self {
            http: HttpClient::new(Duration::from_secs(600)),
            base: cli.url.trim_end_matches('/').to_owned(),
            auth: format!("Bearer {key}"),
        })
    }

    /// The API key (without the `Bearer ` prefix).
    fn key(&self) -> &str {
        self.auth.trim_start_matches("Bearer ")
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: Bytes,
    ) -> Result<Answer, String> {
        let mut h = vec![("authorization", self.auth.as_str())];
        if let Some(ct) = content_type {
            h.push(("content-type", ct));
        }
        let a = self
            .http
            .call(method, &format!("{}{path}", self.base), &h, body)
            .await
            .map_err(|e| format!("cannot reach {}: {e}", self.base))?;
        if a.status.is_success() {
            Ok(a)
        } else {
            Err(describe_error(&a))
        }
    }

    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<T, String> {
        let (ct, bytes) = match body {
            Some(v) => (Some("application/json"), Bytes::from(v.to_string())),
            None => (None, Bytes::new()),
        };
        let a = self.call(method, path, ct, bytes).await?;
        serde_json::from_slice(&a.body).map_err(|e| format!("unexpected answer: {e}"))
    }
}

fn describe_error(a: &Answer) -> String {
    api_error(a.status.as_u16(), &a.body)
}

/// The one form of every error the CLI reports (printed by `main` as
/// `space: error: MESSAGE (CODE, HTTP STATUS)`): an API error body's message, then its
/// code (and reason) and the HTTP status; a body that is not an API error is quoted
/// (its first 512 bytes).
pub(crate) fn api_error(status: u16, body: &[u8]) -> String {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(e) => match e.reason {
            Some(r) => format!("{} ({}: {r}, HTTP {status})", e.message, e.error),
            None => format!("{} ({}, HTTP {status})", e.message, e.error),
        },
        Err(_) => {
            let text = String::from_utf8_lossy(&body[..body.len().min(512)]);
            let text = text.trim();
            if text.is_empty() {
                format!("the server answered HTTP {status} (HTTP {status})")
            } else {
                format!("{text} (HTTP {status})")
            }
        }
    }
}

/// Stdin for a non-streaming exec: nothing when it is a terminal (nobody pipes
/// anything) or empty; otherwise all of it, at most [`MAX_EXEC_STDIN`] bytes (read
/// with that bound: more is refused before anything is sent).
fn piped_stdin() -> Result<Option<Vec<u8>>, String> {
    use std::io::IsTerminal;
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Ok(None);
    }
    let mut buf = Vec::new();
    stdin
        .lock()
        .take(MAX_EXEC_STDIN as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read stdin: {e}"))?;
    if buf.len() > MAX_EXEC_STDIN {
        return Err(format!(
            "stdin is over {} MiB, the limit of an exec; use --stream, which takes any size (too_large)",
            MAX_EXEC_STDIN >> 20
        ));
    }
    Ok((!buf.is_empty()).then_some(buf))
}

/// What the user should know about how an exec ended, beyond its output and code.
fn exec_notes(r: &ExecResponse, max_output: Option<u64>, timeout: Option<u64>) -> Vec<String> {
    let mut notes = Vec::new();
    if r.truncated {
        let cap = max_output.unwrap_or(space_proto::api::DEFAULT_MAX_OUTPUT_BYTES);
        let which = match (r.stdout_truncated, r.stderr_truncated) {
            (true, false) => "stdout",
            (false, true) => "stderr",
            _ => "stdout and stderr",
        };
        notes.push(format!(
            "output truncated at {cap} bytes ({which}); use --stream for more"
        ));
    }
    if r.timed_out {
        let secs = timeout.unwrap_or(space_proto::api::DEFAULT_EXEC_TIMEOUT_SECS);
        notes.push(format!("killed: timed out after {secs} s"));
    }
    if r.oom_killed {
        notes.push(match r.memory_limit_mib {
            Some(mib) => format!("killed: out of memory (limit {mib} MiB)"),
            None => "killed: out of memory".to_owned(),
        });
    }
    notes
}

fn parse_env(pairs: &[String]) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let mut env = serde_json::Map::new();
    for p in pairs {
        let (k, v) = p
            .split_once('=')
            .ok_or_else(|| format!("--env {p:?} is not KEY=VALUE"))?;
        env.insert(k.to_owned(), serde_json::Value::String(v.to_owned()));
    }
    Ok(env)
}

pub(crate) use space_client::encode_query;

/// Prints rows as aligned columns.
fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        parts.join("  ").trim_end().to_owned()
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "{}",
        line(headers.iter().map(|h| h.to_string()).collect())
    );
    for r in rows {
        let _ = writeln!(out, "{}", line(r.clone()));
    }
}

/// Shows `label`, the step the control plane reports for sandbox `id` (archiving,
/// transferring, starting, retiring) and the elapsed time on a terminal's stderr
/// while `work` runs.
async fn with_progress<T>(
    c: &Client,
    id: &str,
    label: &str,
    work: impl std::future::Future<Output = T>,
) -> T {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return work.await;
    }
    let started = std::time::Instant::now();
    let mut work = std::pin::pin!(work);
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
    let frames = ['|', '/', '-', '\\'];
    let mut n = 0usize;
    let mut step = String::new();
    let path = format!("/v1/sandboxes/{id}");
    let out = loop {
        tokio::select! {
            v = &mut work => break v,
            _ = tick.tick() => {
                // Every half second, ask where the operation is.
                if n % 5 == 0 {
                    if let Ok(s) = c.json::<Sandbox>(Method::GET, &path, None).await {
                        step = s.step.map(|s| format!(": {s}")).unwrap_or_default();
                    }
                }
                eprint!(
                    "\r\x1b[2K{} {label}{step} {:.1} s",
                    frames[n % frames.len()],
                    started.elapsed().as_secs_f64()
                );
                n += 1;
            }
        }
    };
    eprint!("\r\x1b[2K");
    out
}

fn show(cli: &Cli, s: &Sandbox) {
    if cli.json {
        print_json(s);
    } else {
        table(
            &["ID", "STATE", "GEN", "WORKER", "CREATED"],
            &[sandbox_row(s)],
        );
    }
}

fn sandbox_row(s: &Sandbox) -> Vec<String> {
    let (generation, worker) = s.execution.as_ref().map_or(("-".into(), "-".into()), |e| {
        (e.generation.to_string(), e.worker.to_string())
    });
    vec![
        s.id.to_string(),
        s.state.as_str().to_owned(),
        generation,
        worker,
        s.created_at.clone(),
    ]
}

fn print_json(v: &impl serde::Serialize) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// Runs a client command; returns the process exit code.
pub async fn run(cli: &Cli, cmd: &Command) -> Result<i32, String> {
    let c = Client::new(cli)?;
    match cmd {
        Command::Sandbox(SandboxCmd::Create {
            ttl,
            ttl_action,
            env,
            worker,
            metadata,
            memory_mib,
            cpus,
            pids,
            disk_mib,
        }) => {
            let mut body = serde_json::Map::new();
            let limits = space_proto::api::LimitsRequest {
                memory_mib: *memory_mib,
                cpus: *cpus,
                pids: *pids,
                disk_mib: *disk_mib,
            };
            if limits != space_proto::api::LimitsRequest::default() {
                let v = serde_json::to_value(limits).map_err(|e| e.to_string())?;
                body.insert("limits".into(), v);
            }
            if let Some(t) = ttl {
                body.insert("ttl_secs".into(), (*t).into());
            }
            if let Some(a) = ttl_action {
                body.insert("ttl_action".into(), a.clone().into());
            }
            if !env.is_empty() {
                body.insert("env".into(), parse_env(env)?.into());
            }
            if let Some(w) = worker {
                body.insert("worker".into(), w.clone().into());
            }
            if let Some(m) = metadata {
                let v: serde_json::Value =
                    serde_json::from_str(m).map_err(|e| format!("--metadata: {e}"))?;
                body.insert("metadata".into(), v);
            }
            let s: Sandbox = c
                .json(Method::POST, "/v1/sandboxes", Some(body.into()))
                .await?;
            if cli.json {
                print_json(&s);
            } else {
                println!("{}", s.id);
            }
        }
        Command::Sandbox(SandboxCmd::List) => {
            let list: Vec<Sandbox> = c.json(Method::GET, "/v1/sandboxes", None).await?;
            if cli.json {
                print_json(&list);
            } else {
                table(
                    &["ID", "STATE", "GEN", "WORKER", "CREATED"],
                    &list.iter().map(sandbox_row).collect::<Vec<_>>(),
                );
            }
        }
        Command::Sandbox(SandboxCmd::Get { id }) => {
            let s: Sandbox = c
                .json(Method::GET, &format!("/v1/sandboxes/{id}"), None)
                .await?;
            if cli.json {
                print_json(&s);
            } else {
                table(
                    &["ID", "STATE", "GEN", "WORKER", "CREATED"],
                    &[sandbox_row(&s)],
                );
            }
        }
        Command::Sandbox(SandboxCmd::Pause { id }) => {
            let s: Sandbox = c
                .json(Method::POST, &format!("/v1/sandboxes/{id}/pause"), None)
                .await?;
            show(cli, &s);
        }
        Command::Sandbox(SandboxCmd::Resume { id, worker }) => {
            let body = worker.as_ref().map(|w| serde_json::json!({ "worker": w }));
            let path = format!("/v1/sandboxes/{id}/resume");
            let call = c.json::<Sandbox>(Method::POST, &path, body);
            let s = match worker {
                Some(w) => with_progress(&c, id, &format!("restoring {id} on {w}"), call).await?,
                None => call.await?,
            };
            show(cli, &s);
        }
        Command::Sandbox(SandboxCmd::Snapshot { id }) => {
            let path = format!("/v1/sandboxes/{id}/snapshot");
            let v: serde_json::Value = with_progress(
                &c,
                id,
                &format!("snapshot of {id}"),
                c.json(Method::POST, &path, None),
            )
            .await?;
            if cli.json {
                print_json(&v);
            } else {
                println!(
                    "snapshot of generation {}: {} bytes, blake3 {}",
                    v["generation"],
                    v["size"],
                    v["digest"].as_str().unwrap_or("?")
                );
            }
        }
        Command::Sandbox(SandboxCmd::Migrate { id, worker }) => {
            let started = std::time::Instant::now();
            let body = serde_json::json!({ "worker": worker });
            let path = format!("/v1/sandboxes/{id}/migrate");
            let call = c.json::<Sandbox>(Method::POST, &path, Some(body));
            let s = with_progress(&c, id, &format!("migrating {id} to {worker}"), call).await?;
            if cli.json {
                print_json(&s);
            } else {
                table(
                    &["ID", "STATE", "GEN", "WORKER", "CREATED"],
                    &[sandbox_row(&s)],
                );
                if let Some(e) = &s.execution {
                    println!(
                        "new execution {} (generation {}) on {} in {:.0} ms",
                        e.execution_id,
                        e.generation,
                        e.worker,
                        started.elapsed().as_secs_f64() * 1e3
                    );
                }
            }
        }
        Command::Sandbox(SandboxCmd::Rm { id }) => {
            c.call(
                Method::DELETE,
                &format!("/v1/sandboxes/{id}"),
                None,
                Bytes::new(),
            )
            .await?;
        }
        Command::Exec(a) => {
            let mut body = serde_json::json!({ "cmd": a.cmd });
            if let Some(t) = a.timeout {
                body["timeout_secs"] = t.into();
            }
            if let Some(cwd) = &a.cwd {
                body["cwd"] = cwd.clone().into();
            }
            if !a.env.is_empty() {
                body["env"] = parse_env(&a.env)?.into();
            }
            if let (Some(n), false) = (a.max_output_bytes, a.stream) {
                body["max_output_bytes"] = n.into();
            }
            if a.stream {
                return crate::streams::exec(&c.base, c.key(), &a.sandbox, &body, !a.no_stdin)
                    .await;
            }
            if !a.no_stdin {
                if let Some(bytes) = piped_stdin()? {
                    use base64::Engine as _;
                    let text = base64::engine::general_purpose::STANDARD.encode(&bytes);
                    drop(bytes);
                    body["stdin_base64"] = text.into();
                }
            }
            let r: ExecResponse = c
                .json(
                    Method::POST,
                    &format!("/v1/sandboxes/{}/exec", a.sandbox),
                    Some(body),
                )
                .await?;
            if cli.json {
                print_json(&r);
            } else {
                let _ = std::io::stdout().write_all(r.stdout.as_bytes());
                let _ = std::io::stderr().write_all(r.stderr.as_bytes());
            }
            for line in exec_notes(&r, a.max_output_bytes, a.timeout) {
                eprintln!("space: {line}");
            }
            return Ok(r.exit_code.clamp(0, 255));
        }
        Command::Fs(FsCmd::Get {
            sandbox,
            path,
            local,
        }) => crate::files::get(&c.base, c.key(), sandbox, path, local.as_deref()).await?,
        Command::Fs(FsCmd::Put {
            sandbox,
            local,
            path,
        }) => crate::files::put(&c.base, c.key(), sandbox, local, path).await?,
        Command::Fs(FsCmd::Ls { sandbox, path }) => {
            let list: Vec<FileEntry> = c
                .json(
                    Method::GET,
                    &format!(
                        "/v1/sandboxes/{sandbox}/files/list?path={}",
                        encode_query(path)
                    ),
                    None,
                )
                .await?;
            if cli.json {
                print_json(&list);
            } else {
                let rows: Vec<Vec<String>> = list
                    .iter()
                    .map(|e| vec![e.kind.clone(), e.size.to_string(), e.name.clone()])
                    .collect();
                table(&["KIND", "SIZE", "NAME"], &rows);
            }
        }
        Command::Fs(FsCmd::Rm { sandbox, path }) => {
            c.call(
                Method::DELETE,
                &format!("/v1/sandboxes/{sandbox}/files?path={}", encode_query(path)),
                None,
                Bytes::new(),
            )
            .await?;
        }
        Command::Workers => {
            let list: Vec<WorkerView> = c.json(Method::GET, "/v1/workers", None).await?;
            if cli.json {
                print_json(&list);
            } else {
                let rows: Vec<Vec<String>> = list
                    .iter()
                    .map(|w| {
                        vec![
                            w.id.to_string(),
                            w.state.clone(),
                            format!("{}/{}", w.sandboxes, w.capacity),
                            w.substrate.to_string(),
                            w.address.clone(),
                        ]
                    })
                    .collect();
                table(&["ID", "STATE", "SANDBOXES", "SUBSTRATE", "ADDRESS"], &rows);
            }
        }
        Command::Keys(KeysCmd::Rotate) => {
            let v: serde_json::Value = c
                .json(Method::POST, "/v1/signing-keys/rotate", None)
                .await?;
            if cli.json {
                print_json(&v);
            } else {
                println!(
                    "active signing key: {}",
                    v["active_key"].as_str().unwrap_or("?")
                );
            }
        }
        Command::Term { sandbox } => {
            return crate::streams::term(&c.base, c.key(), sandbox).await;
        }
        Command::Watch {
            sandbox,
            path,
            recursive,
        } => {
            return crate::streams::watch(&c.base, c.key(), sandbox, path, *recursive).await;
        }
        Command::Up(_)
        | Command::Control(_)
        | Command::Worker(_)
        | Command::Edge(_)
        | Command::Bench(_) => {
            return Err("not a client command".into());
        }
    }
    Ok(0)
}
