//! A real `space up` (this executable) for a benchmark: a temporary data directory, an
//! ephemeral loopback port, the workers it supervises; stopped (SIGTERM, then SIGKILL)
//! and its directory removed when dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::Method;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How the platform is started.
#[derive(Debug, Clone)]
pub struct PlatformOptions {
    /// Worker processes.
    pub workers: u32,
    /// Warm jails per worker.
    pub warm_pool: usize,
    /// Standby sandboxes in all.
    pub standby: usize,
    /// Extra environment of `space up` (and so of its workers).
    pub env: Vec<(String, String)>,
}

impl Default for PlatformOptions {
    fn default() -> Self {
        Self {
            workers: 2,
            warm_pool: 2,
            standby: 0,
            env: Vec::new(),
        }
    }
}

/// A running `space up`.
#[derive(Debug)]
pub struct Platform {
    /// The edge's base URL.
    pub url: String,
    /// The admin API key.
    pub admin_key: String,
    /// Its data directory (inside a temporary directory removed on drop).
    pub data_dir: PathBuf,
    /// Worker IDs (`w1` …).
    pub workers: Vec<String>,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Platform {
    /// Starts `space up` and waits until every worker is active.
    pub async fn start(o: PlatformOptions) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
        let dir = tempfile::Builder::new()
            .prefix("space-bench-")
            .tempdir()
            .map_err(|e| format!("temporary directory: {e}"))?;
        let data_dir = dir.path().join("data");
        let mut child = Command::new(exe)
            .arg("up")
            .args(["--listen", "127.0.0.1:0", "--workers"])
            .arg(o.workers.to_string())
            .arg("--warm-pool")
            .arg(o.warm_pool.to_string())
            .arg("--standby")
            .arg(o.standby.to_string())
            .arg("--data-dir")
            .arg(&data_dir)
            .env("SPACE_LOG", "warn")
            .env("SPACE_RECONCILE_AFTER_SECS", "1")
            // The figures are of the host-directories default (no image built).
            .env("SPACE_DEFAULT_TEMPLATE", "host")
            // No egress unless a figure asks for it (`bench egress` does, with slots
            // of its own).
            .env("SPACE_NO_EGRESS", "1")
            .envs(o.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start space up: {e}"))?;
        let stdout = child.stdout.take().ok_or("space up: no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .map_err(|_| "space up did not start within 60 s".to_owned())?
            .map_err(|e| format!("space up: {e}"))?
            .ok_or("space up exited before it was up")?;
        let url = first
            .strip_prefix("SPACE is up at ")
            .ok_or_else(|| format!("space up said {first:?}"))?
            .to_owned();
        // Keep draining its stdout so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let admin_key = std::fs::read_to_string(data_dir.join("admin.key"))
            .map_err(|e| format!("admin key: {e}"))?
            .trim()
            .to_owned();
        let p = Self {
            url,
            admin_key,
            data_dir,
            workers: (1..=o.workers).map(|n| format!("w{n}")).collect(),
            dir,
            child: Some(child),
        };
        p.wait_for_workers(o.workers as usize, Duration::from_secs(60))
            .await?;
        Ok(p)
    }

    /// Waits until `n` workers are active.
    pub async fn wait_for_workers(&self, n: usize, within: Duration) -> Result<(), String> {
        let http = space_http::HttpClient::new(Duration::from_secs(10));
        let auth = format!("Bearer {}", self.admin_key);
        let deadline = Instant::now() + within;
        loop {
            if let Ok(a) = http
                .call(
                    Method::GET,
                    &format!("{}/v1/workers", self.url),
                    &[("authorization", &auth)],
                    Bytes::new(),
                )
                .await
            {
                let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap_or_default();
                let active = v
                    .as_array()
                    .map_or(0, |a| a.iter().filter(|w| w["state"] == "active").count());
                if active >= n {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!("{n} workers did not become active"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The process of worker `id`, found by its data directory on its command line.
    pub fn worker_pid(&self, id: &str) -> Option<i32> {
        let dir = self.data_dir.join("workers").join(id);
        find_process(&["worker", "--id", id], &dir)
    }

    /// Stops `space up` (SIGTERM; SIGKILL after 30 s) and waits for it.
    pub async fn stop(mut self) {
        self.shut_down().await;
    }

    async fn shut_down(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: kill(2) on our own child's PID, which it still is (not yet reaped).
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        if tokio::time::timeout(Duration::from_secs(30), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }
}

impl Drop for Platform {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        let _ = &self.dir;
    }
}

/// The first process whose command line holds `words` in order and mentions `dir`.
fn find_process(words: &[&str], dir: &Path) -> Option<i32> {
    let dir = dir.to_string_lossy().into_owned();
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let has_words = args.windows(words.len()).any(|w| w.iter().eq(words.iter()));
        if has_words && args.iter().any(|a| a.contains(&dir)) {
            return Some(pid);
        }
    }
    None
}

// ---- For the figures (P3–P8): clients, metrics, pools ----

impl Platform {
    /// An SDK client with the admin key: in direct mode, or through the edge.
    pub fn client(&self, direct: bool) -> space_client::Client {
        space_client::Client::with_options(
            &self.url,
            &self.admin_key,
            space_client::Options {
                direct,
                timeout: Duration::from_secs(60),
            },
        )
    }

    /// Each worker's ID and node-api URL, from `GET /v1/workers`.
    pub async fn worker_urls(&self) -> Result<Vec<(String, String)>, String> {
        let http = space_http::HttpClient::new(Duration::from_secs(10));
        let auth = format!("Bearer {}", self.admin_key);
        let a = http
            .call(
                Method::GET,
                &format!("{}/v1/workers", self.url),
                &[("authorization", &auth)],
                Bytes::new(),
            )
            .await
            .map_err(|e| format!("GET /v1/workers: {e}"))?;
        let v: serde_json::Value =
            serde_json::from_slice(&a.body).map_err(|e| format!("GET /v1/workers: {e}"))?;
        Ok(v.as_array()
            .map(|list| {
                list.iter()
                    .filter_map(|w| Some((w["id"].as_str()?.into(), w["address"].as_str()?.into())))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The node-api URL of worker `id`.
    pub async fn worker_url(&self, id: &str) -> Result<String, String> {
        self.worker_urls()
            .await?
            .into_iter()
            .find_map(|(w, url)| (w == id).then_some(url))
            .ok_or_else(|| format!("no worker {id}"))
    }

    /// The control plane's metric `name` (the whole sample name, labels included), 0
    /// when absent.
    pub async fn control_metric(&self, name: &str) -> f64 {
        metric(&self.url, name).await
    }

    /// Waits until every worker keeps `warm` warm jails ready and the control plane
    /// `standby` standby sandboxes, twice a keeper tick apart (so a refill under way is
    /// seen): figures are measured on a quiet platform.
    pub async fn wait_for_pools(
        &self,
        warm: usize,
        standby: usize,
        within: Duration,
    ) -> Result<(), String> {
        let deadline = Instant::now() + within;
        let workers = self.worker_urls().await?;
        for _ in 0..2 {
            loop {
                let mut full =
                    self.control_metric("space_control_standby_ready").await >= standby as f64;
                for (_, url) in &workers {
                    full &=
                        warm == 0 || metric(url, "space_worker_warm_ready").await >= warm as f64;
                }
                if full {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "the pools ({warm} warm jails per worker, {standby} standby) did not fill"
                    ));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        Ok(())
    }
}

/// Metric `name` (the whole sample name, labels included) at `base/metrics`, 0 when
/// absent or unreachable.
pub async fn metric(base: &str, name: &str) -> f64 {
    let http = space_http::HttpClient::new(Duration::from_secs(10));
    let Ok(a) = http
        .call(Method::GET, &format!("{base}/metrics"), &[], Bytes::new())
        .await
    else {
        return 0.0;
    };
    String::from_utf8_lossy(&a.body)
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}
