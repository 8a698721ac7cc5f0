//! Structure rules of the workspace, checked on its sources (`docs/architecture.md`):
//!
//! - no source file under `crates/*/src/` is over [`MAX_LINES`] lines, not counting
//!   a trailing `#[cfg(test)] mod tests { … }` block; files that are test modules
//!   themselves (declared under `#[cfg(test)]`) do not count at all;
//! - `space-identity` stays pure: no clock read, no socket, no file, no runtime.

use std::path::{Path, PathBuf};

/// The most lines a source file may hold before its trailing test module.
const MAX_LINES: usize = 800;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/space-testkit sits two levels below the workspace root")
        .to_path_buf()
}

/// Every `.rs` file below `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The `src/` directory of every crate of the workspace.
fn crate_sources(root: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path().join("src"))
        .filter(|src| src.is_dir())
        .collect();
    out.sort();
    out
}

/// Lines that count: those before a `#[cfg(test)]` (and the attributes after it)
/// opening a `mod … {` block that runs to the end of the file; all of them otherwise.
fn counted_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let last = lines.iter().rposition(|l| !l.trim().is_empty());
    let Some(last) = last else {
        return 0;
    };
    for (i, line) in lines.iter().enumerate() {
        if line.trim_end() != "#[cfg(test)]" {
            continue;
        }
        // Further attributes may follow (`#[allow(…)]`), then the module itself.
        let mut j = i + 1;
        while j < lines.len() && lines[j].starts_with("#[") {
            j += 1;
        }
        let opens_module = lines.get(j).is_some_and(|l| {
            let l = l.trim_end();
            l.ends_with(" {")
                && l.trim_start_matches("pub(crate) ")
                    .trim_start_matches("pub ")
                    .starts_with("mod ")
        });
        if !opens_module {
            continue;
        }
        // rustfmt leaves the module's closing brace alone at the start of a line: the
        // first such line closes it. Trailing only if nothing but blank lines follows.
        let close = lines[j + 1..].iter().position(|l| l.trim_end() == "}");
        if close.is_some_and(|c| j + 1 + c == last) {
            return i;
        }
    }
    lines.len()
}

/// The files of modules declared `mod name;` in `file`, each with whether the
/// declaration is under `#[cfg(test)]`.
fn declared_modules(file: &Path) -> Vec<(PathBuf, bool)> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return Vec::new();
    };
    let dir = file.parent().unwrap();
    let stem = file.file_stem().unwrap().to_str().unwrap();
    // Where `mod name;` looks: beside lib.rs, main.rs and mod.rs; below foo/ for foo.rs.
    let children = if matches!(stem, "lib" | "main" | "mod") {
        dir.to_path_buf()
    } else {
        dir.join(stem)
    };
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = line
            .split_once("mod ")
            .filter(|(vis, _)| vis.is_empty() || vis.starts_with("pub"))
            .and_then(|(_, rest)| rest.strip_suffix(';'))
        else {
            continue;
        };
        let attributes: Vec<&str> = lines[..i]
            .iter()
            .rev()
            .take_while(|l| l.starts_with("#["))
            .copied()
            .collect();
        let test = attributes.iter().any(|a| a.starts_with("#[cfg(test)]"));
        // `#[path = "x.rs"]` is relative to the directory of the declaring file.
        let path = attributes.iter().find_map(|a| {
            a.strip_prefix("#[path = \"")?
                .strip_suffix("\"]")
                .map(|p| dir.join(p))
        });
        let path = path.unwrap_or_else(|| {
            let flat = children.join(format!("{name}.rs"));
            if flat.is_file() {
                flat
            } else {
                children.join(name).join("mod.rs")
            }
        });
        out.push((path, test));
    }
    out
}

/// The files below `src` that are test modules: declared under `#[cfg(test)]` (like
/// `foo/tests.rs`), or declared by such a file.
fn test_modules(src: &Path) -> std::collections::BTreeSet<PathBuf> {
    let mut tests = std::collections::BTreeSet::new();
    for file in rust_files(src) {
        for (child, test) in declared_modules(&file) {
            if test {
                tests.insert(child);
            }
        }
    }
    let mut pending: Vec<PathBuf> = tests.iter().cloned().collect();
    while let Some(file) = pending.pop() {
        for (child, _) in declared_modules(&file) {
            if tests.insert(child.clone()) {
                pending.push(child);
            }
        }
    }
    tests
}

/// Files over the limit, with the lines that count, relative to `root`.
fn oversized(root: &Path) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for src in crate_sources(root) {
        let tests = test_modules(&src);
        for file in rust_files(&src) {
            if tests.contains(&file) {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let n = counted_lines(&text);
            if n > MAX_LINES {
                let rel = file.strip_prefix(root).unwrap().display().to_string();
                out.push((rel, n));
            }
        }
    }
    out
}

#[test]
fn no_source_file_is_over_800_lines_before_its_test_module() {
    let offenders = oversized(&workspace_root());
    assert!(
        offenders.is_empty(),
        "split these files (at most {MAX_LINES} lines before a trailing test module):\n{}",
        offenders
            .iter()
            .map(|(f, n)| format!("  {f}: {n} lines"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// What `space-identity` must never name: a clock, the network, the file system, a
/// runtime, or spawning (time is a parameter there; I/O belongs to its callers).
const IMPURE: &[&str] = &[
    "SystemTime",
    "Instant::now",
    "std::net",
    "std::fs",
    "std::process",
    "std::thread",
    "tokio",
];

/// Every line of the sources below `src` that names one of [`IMPURE`] outside a
/// comment, as `file:line: word`.
fn impure_lines(src: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for file in rust_files(src) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for word in IMPURE.iter().filter(|w| code.contains(*w)) {
                let rel = file.strip_prefix(src).unwrap().display();
                found.push(format!("{rel}:{}: {word}", i + 1));
            }
        }
    }
    found
}

#[test]
fn space_identity_reads_no_clock_and_does_no_io() {
    let found = impure_lines(&workspace_root().join("crates/space-identity/src"));
    assert!(
        found.is_empty(),
        "space-identity is pure (time passed in, no I/O), but:\n  {}",
        found.join("\n  ")
    );
}

// ---- The checks check: each rule on sources made to break it ----

#[test]
fn a_trailing_test_module_does_not_count_and_code_after_one_does() {
    let body = "fn f() {}\n".repeat(10);
    let tests = "#[cfg(test)]\nmod tests {\n    #[test]\n    fn t() {}\n}\n";
    assert_eq!(counted_lines(&format!("{body}{tests}")), 10);
    assert_eq!(counted_lines(&format!("{body}{tests}\n\n")), 10);
    let attributed = "#[cfg(test)]\n#[allow(clippy::all)]\nmod tests {\n    fn t() {}\n}\n";
    assert_eq!(counted_lines(&format!("{body}{attributed}")), 10);
    // Code after the test module: the whole file counts.
    let after = format!("{body}{tests}fn g() {{}}\n");
    assert_eq!(counted_lines(&after), 16);
    // A test module declared in a file of its own is one line here.
    assert_eq!(
        counted_lines(&format!("{body}#[cfg(test)]\nmod tests;\n")),
        12
    );
}

#[test]
fn a_file_over_the_limit_is_named_with_its_count_and_a_test_module_file_is_not() {
    let root = std::env::temp_dir().join(format!("space-structure-{}", std::process::id()));
    let src = root.join("crates/big/src");
    std::fs::create_dir_all(src.join("part")).unwrap();
    let long = "fn f() {}\n".repeat(MAX_LINES + 1);
    std::fs::write(
        src.join("lib.rs"),
        "mod part;\n#[cfg(test)]\nmod tests;\n#[cfg(test)]\n#[path = \"part_tests.rs\"]\nmod more;\n",
    )
    .unwrap();
    std::fs::write(src.join("part_tests.rs"), format!("mod fixtures;\n{long}")).unwrap();
    std::fs::create_dir_all(src.join("part_tests")).unwrap();
    std::fs::write(src.join("part_tests/fixtures.rs"), &long).unwrap();
    std::fs::write(
        src.join("part.rs"),
        format!("{long}#[cfg(test)]\nmod tests;\n"),
    )
    .unwrap();
    std::fs::write(src.join("part/tests.rs"), &long).unwrap();
    std::fs::write(src.join("tests.rs"), &long).unwrap();
    std::fs::write(src.join("part/ok.rs"), "fn f() {}\n".repeat(MAX_LINES)).unwrap();
    let found = oversized(&root);
    std::fs::remove_dir_all(&root).unwrap();
    assert_eq!(
        found,
        vec![("crates/big/src/part.rs".to_owned(), MAX_LINES + 3)]
    );
}

#[test]
fn a_clock_read_in_code_is_found_and_one_in_a_comment_is_not() {
    let src = std::env::temp_dir().join(format!("space-purity-{}", std::process::id()));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(
        src.join("lib.rs"),
        "/// Not `SystemTime::now`: time is a parameter.\n\
         pub fn at(now: u64) -> u64 { now } // never tokio\n\
         pub fn bad() -> std::time::SystemTime { std::time::SystemTime::now() }\n",
    )
    .unwrap();
    let found = impure_lines(&src);
    std::fs::remove_dir_all(&src).unwrap();
    assert_eq!(found, vec!["lib.rs:3: SystemTime".to_owned()]);
}
