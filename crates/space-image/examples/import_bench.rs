//! `cargo run --release -p space-image --example import_bench [MiB] [DIR]`: the
//! import benchmark without a platform (`space bench image` runs the same).

#![allow(clippy::print_stdout)]

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let base = args.next().map_or_else(std::env::temp_dir, Into::into);
    let scratch = tempfile::Builder::new()
        .prefix("space-bench-image-")
        .tempdir_in(base)
        .unwrap_or_else(|e| panic!("scratch: {e}"));
    match space_image::bench::import_vs_tar(scratch.path(), mib << 20) {
        Ok(b) => println!(
            "{b:?}\nimport / tar -x = {:.2} (import / (tar -x + sync) = {:.2})",
            b.import_secs / b.tar_secs,
            b.import_secs / b.tar_sync_secs
        ),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
