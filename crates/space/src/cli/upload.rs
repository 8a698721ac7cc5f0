//! An image archive or OCI layout sent to the platform as a template (`space template
//! import`, and `pull` once the image is here), the bytes sent shown as they go.
//! Apart from `templates` so that `pull`, which `args` names, does not reach `args`
//! back through it.

use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use space_client::{Client, ImageArchive, TemplateView};

/// Bytes, readable (KiB below a MiB).
pub(super) fn size(bytes: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / MIB)
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}

/// Imports the archive or OCI layout directory at `path` as `name`, showing the bytes
/// sent on stderr.
pub(super) async fn upload(
    c: &Client,
    name: &str,
    path: &Path,
    sdk: &dyn Fn(space_client::Error) -> String,
) -> Result<TemplateView, String> {
    let archive = ImageArchive::open(path).await.map_err(sdk)?;
    let (sent, total) = (archive.sent(), archive.known_len());
    let progress = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let n = sent.load(Ordering::Relaxed);
            let of = total.map_or_else(String::new, |t| format!(" of {}", size(t)));
            eprint!("\rsent {}{of}   ", size(n));
            let _ = std::io::stderr().flush();
        }
    });
    let imported = c.import_template_from(name, archive).await;
    progress.abort();
    eprintln!();
    imported.map_err(sdk)
}
