//! The `space-jail` binary: see the library documentation for the calling
//! convention.

fn main() {
    std::process::exit(space_jail::main_entry());
}
