//! `spaced-guest`: see the library.
fn main() {}
