//! The client commands: sandboxes (their network policy: `network`), exec, files,
//! ports (`ports`), workers, keys — every call made with the SDK (`space_client`)
//! through the edge, which recovers routes on its side. Errors take one form
//! (`errors`).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::Duration;

use space_client::{Client, CreateSandbox, ExecRequest, ExecResponse, Options, Sandbox};
use space_identity::{SandboxId, WorkerId};
use space_proto::api::MAX_EXEC_STDIN;

use crate::args::{Cli, Command, FsCmd, KeysCmd, SandboxCmd};

pub(crate) mod build;
pub(crate) mod errors;
mod network;
mod output;
mod ports;
pub(crate) mod pull;
mod templates;
mod upload;

use output::{print_json, sandbox_id, table};

/// The SDK through the edge at `cli.url` with the API key.
fn client(cli: &Cli) -> Result<Client, String> {
    let key = match &cli.api_key {
        Some(k) => k.clone(),
        None => std::fs::read_to_string(".space/admin.key")
            .map(|s| s.trim().to_owned())
            .map_err(|_| "no API key: set SPACE_API_KEY or --api-key (space up writes one to .space/admin.key)".to_owned())?,
    };
    let options = Options {
        direct: false,
        timeout: Duration::from_secs(600),
    };
    Ok(Client::with_options(&cli.url, &key, options))
}

fn worker_id(id: &str) -> Result<WorkerId, String> {
    id.parse().map_err(|_| errors::bad_worker(id))
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

fn parse_env(pairs: &[String]) -> Result<Option<BTreeMap<String, String>>, String> {
    let mut env = BTreeMap::new();
    for p in pairs {
        let (k, v) = p
            .split_once('=')
            .ok_or_else(|| format!("--env {p:?} is not KEY=VALUE"))?;
        env.insert(k.to_owned(), v.to_owned());
    }
    Ok((!env.is_empty()).then_some(env))
}

/// Shows `label`, the step the control plane reports for sandbox `id` (archiving,
/// transferring, starting, retiring) and the elapsed time on a terminal's stderr
/// while `work` runs.
async fn with_progress<T>(
    c: &Client,
    id: &SandboxId,
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
    let out = loop {
        tokio::select! {
            v = &mut work => break v,
            _ = tick.tick() => {
                // Every half second, ask where the operation is.
                if n % 5 == 0 {
                    if let Ok(s) = c.sandbox(id).await {
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

/// Runs a client command; returns the process exit code.
pub async fn run(cli: &Cli, cmd: &Command) -> Result<i32, String> {
    let c = client(cli)?;
    let url = cli.url.trim_end_matches('/');
    let sdk = |e: space_client::Error| errors::describe(&e, url);
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
            network: flags,
            template,
            substrate,
        }) => {
            let limits = space_proto::api::LimitsRequest {
                memory_mib: *memory_mib,
                cpus: *cpus,
                pids: *pids,
                disk_mib: *disk_mib,
            };
            let req = CreateSandbox {
                ttl_secs: *ttl,
                ttl_action: ttl_action.clone(),
                env: parse_env(env)?,
                worker: worker.as_deref().map(worker_id).transpose()?,
                metadata: match metadata {
                    Some(m) => {
                        Some(serde_json::from_str(m).map_err(|e| format!("--metadata: {e}"))?)
                    }
                    None => None,
                },
                limits: (limits != space_proto::api::LimitsRequest::default()).then_some(limits),
                network: network::from_flags(flags.net, &flags.allow, &flags.deny)?,
                template: template.clone(),
                substrate: *substrate,
            };
            let s = c.create_sandbox(&req).await.map_err(sdk)?;
            if cli.json {
                print_json(&s);
            } else {
                println!("{}", s.id);
            }
        }
        Command::Sandbox(SandboxCmd::List) => {
            let list = c.sandboxes().await.map_err(sdk)?;
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
            let s = c.sandbox(&sandbox_id(id)?).await.map_err(sdk)?;
            show(cli, &s);
            if !cli.json {
                println!("{}", network::line(&s.id, &s.network));
            }
        }
        Command::Sandbox(SandboxCmd::Network { id, network: flags }) => {
            return network::run(&c, cli, url, id, flags.net, &flags.allow, &flags.deny).await;
        }
        Command::Sandbox(SandboxCmd::Events { id }) => {
            let events = c.events(&sandbox_id(id)?).await.map_err(sdk)?;
            if cli.json {
                print_json(&events);
            } else if events.is_empty() {
                println!("no events");
            } else {
                network::print_events(&events);
            }
        }
        Command::Sandbox(SandboxCmd::Pause { id }) => {
            let s = c.pause(&sandbox_id(id)?).await.map_err(sdk)?;
            show(cli, &s);
        }
        Command::Sandbox(SandboxCmd::Resume { id, worker }) => {
            let id = sandbox_id(id)?;
            let s = match worker {
                Some(w) => {
                    let to = worker_id(w)?;
                    let label = format!("restoring {id} on {w}");
                    with_progress(&c, &id, &label, c.resume(&id, Some(&to))).await
                }
                None => c.resume(&id, None).await,
            }
            .map_err(sdk)?;
            show(cli, &s);
        }
        Command::Sandbox(SandboxCmd::Snapshot { id }) => {
            let id = sandbox_id(id)?;
            let label = format!("snapshot of {id}");
            let v = with_progress(&c, &id, &label, c.snapshot(&id))
                .await
                .map_err(sdk)?;
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
            let (id, to) = (sandbox_id(id)?, worker_id(worker)?);
            let label = format!("migrating {id} to {worker}");
            let s = with_progress(&c, &id, &label, c.migrate(&id, &to))
                .await
                .map_err(sdk)?;
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
            c.delete_sandbox(&sandbox_id(id)?).await.map_err(sdk)?;
        }
        Command::Exec(a) => {
            let id = sandbox_id(&a.sandbox)?;
            let mut req = ExecRequest {
                cmd: a.cmd.clone(),
                timeout_secs: a.timeout,
                cwd: a.cwd.clone(),
                env: parse_env(&a.env)?,
                user: a.user.as_deref().map(space_proto::api::User::parse),
                ..ExecRequest::default()
            };
            if a.stream {
                return crate::streams::exec(&c, url, &id, &req, !a.no_stdin).await;
            }
            req.max_output_bytes = a.max_output_bytes;
            if !a.no_stdin {
                if let Some(bytes) = piped_stdin()? {
                    use base64::Engine as _;
                    let text = base64::engine::general_purpose::STANDARD.encode(&bytes);
                    drop(bytes);
                    req.stdin_base64 = Some(text);
                }
            }
            let r = c.exec(&id, &req).await.map_err(sdk)?;
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
            recursive: false,
        }) => crate::files::get(&c, sandbox, path, local.as_deref()).await?,
        Command::Fs(FsCmd::Get {
            sandbox,
            path,
            local,
            recursive: true,
        }) => crate::files::get_tree(&c, sandbox, path, local.as_deref()).await?,
        Command::Fs(FsCmd::Put {
            sandbox,
            local,
            path,
            recursive,
            mode,
            user,
        }) => {
            let user = user.as_deref().map(space_proto::api::User::parse);
            if *recursive {
                crate::files::put_tree(&c, sandbox, local, path, user).await?;
            } else {
                crate::files::put(&c, sandbox, local, path, *mode, user).await?;
            }
        }
        Command::Fs(FsCmd::Ls { sandbox, path }) => {
            let list = c
                .list_files(&sandbox_id(sandbox)?, path)
                .await
                .map_err(sdk)?;
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
            c.remove_file(&sandbox_id(sandbox)?, path)
                .await
                .map_err(sdk)?;
        }
        Command::Workers => {
            let list = c.workers().await.map_err(sdk)?;
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
            let v = c.rotate_signing_key().await.map_err(sdk)?;
            if cli.json {
                print_json(&v);
            } else {
                println!(
                    "active signing key: {}",
                    v["active_key"].as_str().unwrap_or("?")
                );
            }
        }
        Command::Keys(KeysCmd::Create { e2b }) => {
            let v = c.create_key(*e2b).await.map_err(sdk)?;
            if cli.json {
                print_json(&v);
            } else {
                println!("{}", v["api_key"].as_str().unwrap_or("?"));
            }
        }
        Command::Port(p) => return ports::run(&c, cli, url, p).await,
        Command::Template(t) => return templates::run(&c, cli, url, t).await,
        Command::Term { sandbox, user } => {
            let user = user.as_deref().map(space_proto::api::User::parse);
            return crate::streams::term(&c, url, &sandbox_id(sandbox)?, user.as_ref()).await;
        }
        Command::Watch {
            sandbox,
            path,
            recursive,
        } => {
            let id = sandbox_id(sandbox)?;
            return crate::streams::watch(&c, url, &id, path, *recursive).await;
        }
        Command::Up(_)
        | Command::Control(_)
        | Command::Worker(_)
        | Command::Edge(_)
        | Command::Bench(_)
        | Command::Vm(_) => {
            return Err("not a client command".into());
        }
    }
    Ok(0)
}
