//! Agent benchmarks.
fn main() {}
