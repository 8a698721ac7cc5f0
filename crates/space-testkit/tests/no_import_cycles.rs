//! No module of a workspace crate depends on itself through other modules.
//!
//! For every crate under `crates/` (its library root `src/lib.rs`, its binary roots
//! `src/main.rs` and `src/bin/*`, each a crate of its own), the module tree is read
//! from the `mod` declarations (`mod x;` files, `#[path]` included, and inline
//! `mod x { … }` blocks, each a module of its own), and a graph is built: module A
//! depends on module B when A names B in
//!
//! - a `use` item — `crate::…`, `super::…`, `self::…`, or a path starting with one of
//!   A's own child modules; every leaf of a `use` group counts, `self` in a group
//!   meaning the group's prefix, and `*` the module globbed; or
//! - a qualified path anywhere else in A's code (`super::updates::apply(…)`,
//!   `crate::substrate::tree::remove_tree(…)`, `child::item`).
//!
//! A path names the deepest module it reaches (`crate::a::b::Item` names `a::b` when
//! `b` is a module, else `a`). Comments and string literals are not code. A module
//! naming itself or one of its own items is no edge.
//!
//! The rule: any cycle in that graph fails, naming every module on it and the line of
//! each step. In particular a child using its parent's items (`use super::*` in
//! `foo/bar.rs`) while the parent merely declares `mod bar` is no cycle — declaring a
//! module is no use of it. The parent using the child's items back *is* one, with a
//! single exception: re-exports — a `pub use` (of any visibility) by a module of
//! items of its own descendants — are no edge, since a facade that only re-exports
//! does not depend on what it re-exports. (Names a module uses through such a
//! re-export, unqualified, are not seen: keep facades free of code that children
//! depend on.)
//!
//! The cycles of every crate are printed; the test fails if there is any.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path below its crate root (`[]` is the root).
type ModPath = Vec<String>;

/// One dependency between modules and where it is written.
#[derive(Debug, Clone)]
struct Edge {
    to: ModPath,
    at: String,
}

/// The modules of one crate and what each uses.
#[derive(Debug, Default)]
struct Graph {
    /// Every module, with the child dir its `mod x;` files are looked up in.
    modules: BTreeMap<ModPath, PathBuf>,
    /// Declared children of each module.
    children: BTreeMap<ModPath, BTreeSet<String>>,
    /// Raw references, resolved once the whole tree is known.
    refs: Vec<Ref>,
}

#[derive(Debug)]
struct Ref {
    from: ModPath,
    segments: Vec<String>,
    re_export: bool,
    at: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Str(String),
    Punct(char),
}

/// Tokens of `src` with their line numbers; comments, char literals, lifetimes and
/// numbers dropped, string literals kept as [`Tok::Str`].
fn lex(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let (mut i, mut line, mut out) = (0, 1, Vec::new());
    let count_lines = |from: usize, to: usize, line: &mut usize| {
        *line += c[from..to.min(c.len())]
            .iter()
            .filter(|&&x| x == '\n')
            .count();
    };
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let (start, mut depth) = (i, 0usize);
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            count_lines(start, i, &mut line);
        } else if let Some(end) = raw_string_end(&c, i) {
            let text: String = c[i..end].iter().collect();
            count_lines(i, end, &mut line);
            out.push((Tok::Str(text), line));
            i = end;
        } else if ch == '"' || ((ch == 'b' || ch == 'c') && next == Some('"')) {
            let start = i;
            i += if ch == '"' { 1 } else { 2 };
            let body = i;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            let text: String = c[body..i.min(c.len())].iter().collect();
            i += 1;
            count_lines(start, i, &mut line);
            out.push((Tok::Str(text), line));
        } else if ch == '\'' || (ch == 'b' && next == Some('\'')) {
            // A char literal ('x', '\n', '\u{1F600}', b'x') or a lifetime ('a).
            let q = if ch == 'b' { i + 1 } else { i };
            if c.get(q + 1) == Some(&'\\') {
                i = q + 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(q + 2) == Some(&'\'') {
                i = q + 3;
            } else {
                i = q + 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = if ch == 'r' && next == Some('#') {
                i + 2
            } else {
                i
            };
            i = start;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push((Tok::Ident(c[start..i].iter().collect()), line));
        } else if ch == ':' && next == Some(':') {
            out.push((Tok::PathSep, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// Where a raw string literal starting at `i` (`r"…"`, `r#"…"#`, `br#"…"#`, `cr"…"`)
/// ends, if one starts there.
fn raw_string_end(c: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if matches!(c.get(j), Some('b' | 'c')) {
        j += 1;
    }
    if c.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = c[j..].iter().take_while(|&&x| x == '#').count();
    j += hashes;
    if c.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < c.len() {
        if c[j] == '"'
            && c[j + 1..]
                .iter()
                .take(hashes)
                .filter(|&&x| x == '#')
                .count()
                == hashes
        {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(c.len())
}

/// The leaves of the use tree starting at `toks[*i]`, each a full path; `*i` ends past
/// the tree.
fn use_tree(toks: &[(Tok, usize)], i: &mut usize, prefix: &[String]) -> Vec<Vec<String>> {
    let mut path = prefix.to_vec();
    if *i < toks.len() && toks[*i].0 == Tok::PathSep {
        // `::std::…`: an extern crate.
        path.push("::".into());
        *i += 1;
    }
    loop {
        match toks.get(*i).map(|t| &t.0) {
            Some(Tok::Ident(name)) => {
                if name == "self" && !path.is_empty() {
                    // `a::{self}` is `a`.
                } else {
                    path.push(name.clone());
                }
                *i += 1;
            }
            Some(Tok::Punct('*')) => {
                *i += 1;
                return vec![path];
            }
            Some(Tok::Punct('{')) => {
                *i += 1;
                let mut leaves = Vec::new();
                loop {
                    match toks.get(*i).map(|t| &t.0) {
                        Some(Tok::Punct('}')) => {
                            *i += 1;
                            return leaves;
                        }
                        Some(Tok::Punct(',')) => *i += 1,
                        None => return leaves,
                        _ => leaves.extend(use_tree(toks, i, &path)),
                    }
                }
            }
            _ => return vec![path],
        }
        match toks.get(*i).map(|t| &t.0) {
            Some(Tok::PathSep) => *i += 1,
            Some(Tok::Ident(kw)) if kw == "as" => {
                *i += 2;
                return vec![path];
            }
            _ => return vec![path],
        }
    }
}

/// Whether the tokens before `at` make its item `pub` (`pub`, `pub(crate)` …).
fn is_pub(toks: &[(Tok, usize)], at: usize) -> bool {
    let Some(mut j) = at.checked_sub(1) else {
        return false;
    };
    if toks[j].0 == Tok::Punct(')') {
        while j > 0 && toks[j].0 != Tok::Punct('(') {
            j -= 1;
        }
        let Some(k) = j.checked_sub(1) else {
            return false;
        };
        j = k;
    }
    toks[j].0 == Tok::Ident("pub".into())
}

/// The `#[path = "…"]` of the `mod` item at `at`, if it has one.
fn path_attr(toks: &[(Tok, usize)], at: usize) -> Option<String> {
    let mut j = at;
    // Past `pub`, `pub(crate)`.
    while j > 0 && matches!(&toks[j - 1].0, Tok::Ident(p) if p == "pub") {
        j -= 1;
    }
    if j > 0 && toks[j - 1].0 == Tok::Punct(')') {
        while j > 0 && toks[j - 1].0 != Tok::Punct('(') {
            j -= 1;
        }
        j = j.saturating_sub(2);
    }
    while j > 0 && toks[j - 1].0 == Tok::Punct(']') {
        let end = j - 1;
        let mut k = end;
        while k > 0 && toks[k].0 != Tok::Punct('[') {
            k -= 1;
        }
        let inner = &toks[k + 1..end];
        if let [(Tok::Ident(p), _), (Tok::Punct('='), _), (Tok::Str(s), _)] = inner {
            if p == "path" {
                return Some(s.clone());
            }
        }
        j = k.saturating_sub(1);
    }
    None
}

/// Reads a crate whose root file is `root`; `read` gives a file's text.
fn read_crate(root: &Path, read: &dyn Fn(&Path) -> Option<String>) -> Result<Graph, String> {
    let mut g = Graph::default();
    let dir = root.parent().unwrap_or(Path::new("")).to_path_buf();
    let mut todo = vec![(root.to_path_buf(), ModPath::new(), dir)];
    while let Some((file, module, child_dir)) = todo.pop() {
        let src = read(&file).ok_or_else(|| format!("cannot read {}", file.display()))?;
        let name = file.display().to_string();
        let toks = lex(&src);
        // Open scopes: module path, its child dir, the brace depth inside it.
        let mut scopes = vec![(module.clone(), child_dir.clone(), 0usize)];
        g.modules.insert(module.clone(), child_dir);
        let mut depth = 0usize;
        let mut i = 0;
        while i < toks.len() {
            let (scope, scope_dir, _) = scopes.last().cloned().expect("a scope is open");
            let line = toks[i].1;
            match &toks[i].0 {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => {
                    depth = depth.saturating_sub(1);
                    if scopes.len() > 1 && depth < scopes.last().map_or(0, |s| s.2) {
                        scopes.pop();
                    }
                }
                Tok::Ident(kw) if kw == "mod" => {
                    if let (Some((Tok::Ident(child), _)), Some((after, _))) =
                        (toks.get(i + 1), toks.get(i + 2))
                    {
                        let mut path = scope.clone();
                        path.push(child.clone());
                        g.children
                            .entry(scope.clone())
                            .or_default()
                            .insert(child.clone());
                        if *after == Tok::Punct(';') {
                            let file_dir = file.parent().unwrap_or(Path::new(""));
                            let found = match path_attr(&toks, i) {
                                Some(p) => Some(file_dir.join(p)),
                                None => [
                                    scope_dir.join(format!("{child}.rs")),
                                    scope_dir.join(child).join("mod.rs"),
                                ]
                                .into_iter()
                                .find(|p| read(p).is_some()),
                            };
                            let found = found.ok_or_else(|| {
                                format!("{name}:{line}: no file for `mod {child};`")
                            })?;
                            let dir = if found.file_name().is_some_and(|n| n == "mod.rs") {
                                found.parent().unwrap_or(Path::new("")).to_path_buf()
                            } else {
                                scope_dir.join(child)
                            };
                            todo.push((found, path, dir));
                            i += 3;
                            continue;
                        }
                        if *after == Tok::Punct('{') {
                            depth += 1;
                            let dir = scope_dir.join(child);
                            g.modules.insert(path.clone(), dir.clone());
                            scopes.push((path, dir, depth));
                            i += 3;
                            continue;
                        }
                    }
                }
                Tok::Ident(kw) if kw == "use" => {
                    let re_export = is_pub(&toks, i);
                    i += 1;
                    for segments in use_tree(&toks, &mut i, &[]) {
                        g.refs.push(Ref {
                            from: scope.clone(),
                            segments,
                            re_export,
                            at: format!("{name}:{line}"),
                        });
                    }
                    continue;
                }
                Tok::Ident(first)
                    if toks.get(i + 1).map(|t| &t.0) == Some(&Tok::PathSep)
                        && (i == 0 || toks[i - 1].0 != Tok::PathSep) =>
                {
                    let mut segments = vec![first.clone()];
                    let mut j = i + 1;
                    while toks.get(j).map(|t| &t.0) == Some(&Tok::PathSep) {
                        match toks.get(j + 1).map(|t| &t.0) {
                            Some(Tok::Ident(s)) => segments.push(s.clone()),
                            _ => break,
                        }
                        j += 2;
                    }
                    g.refs.push(Ref {
                        from: scope.clone(),
                        segments,
                        re_export: false,
                        at: format!("{name}:{line}"),
                    });
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
    Ok(g)
}

impl Graph {
    /// The module a path written in `from` names, if it names one of this crate's.
    fn resolve(&self, from: &ModPath, segments: &[String]) -> Option<ModPath> {
        let (mut base, rest) = match segments.first().map(String::as_str) {
            Some("crate") => (ModPath::new(), &segments[1..]),
            Some("self") => (from.clone(), &segments[1..]),
            Some("super") => {
                let mut base = from.clone();
                let supers = segments.iter().take_while(|s| *s == "super").count();
                for _ in 0..supers {
                    base.pop()?;
                }
                (base, &segments[supers..])
            }
            Some(first) if self.children.get(from).is_some_and(|c| c.contains(first)) => {
                (from.clone(), segments)
            }
            _ => return None,
        };
        for s in rest {
            let mut next = base.clone();
            next.push(s.clone());
            if !self.modules.contains_key(&next) {
                break;
            }
            base = next;
        }
        Some(base)
    }

    /// Module → the modules it depends on (first place each is written).
    fn edges(&self) -> BTreeMap<ModPath, BTreeMap<ModPath, Edge>> {
        let mut out: BTreeMap<ModPath, BTreeMap<ModPath, Edge>> = BTreeMap::new();
        for r in &self.refs {
            let Some(to) = self.resolve(&r.from, &r.segments) else {
                continue;
            };
            if to == r.from || (r.re_export && to.starts_with(&r.from)) {
                continue;
            }
            out.entry(r.from.clone())
                .or_default()
                .entry(to.clone())
                .or_insert(Edge {
                    to,
                    at: format!("{} `{}`", r.at, r.segments.join("::")),
                });
        }
        out
    }

    /// Every cycle, one per strongly connected group of modules, as its steps.
    fn cycles(&self) -> Vec<Vec<(ModPath, Edge)>> {
        let edges = self.edges();
        let mut found = Vec::new();
        let mut covered: BTreeSet<ModPath> = BTreeSet::new();
        for start in edges.keys() {
            if covered.contains(start) {
                continue;
            }
            // The shortest way back to `start`, breadth first.
            let mut back: BTreeMap<ModPath, (ModPath, Edge)> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([start.clone()]);
            let mut closed = None;
            while let Some(m) = queue.pop_front() {
                for (to, e) in edges.get(&m).into_iter().flatten() {
                    if to == start {
                        closed = Some((m.clone(), e.clone()));
                        break;
                    }
                    if !back.contains_key(to) {
                        back.insert(to.clone(), (m.clone(), e.clone()));
                        queue.push_back(to.clone());
                    }
                }
                if closed.is_some() {
                    break;
                }
            }
            let Some((last, e)) = closed else {
                continue;
            };
            let mut steps = vec![(last.clone(), e)];
            let mut at = last;
            while at != *start {
                let (prev, e) = back[&at].clone();
                steps.push((prev.clone(), e));
                at = prev;
            }
            steps.reverse();
            covered.extend(steps.iter().map(|(m, _)| m.clone()));
            found.push(steps);
        }
        found
    }
}

fn show(m: &ModPath) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        format!("crate::{}", m.join("::"))
    }
}

fn describe(cycle: &[(ModPath, Edge)]) -> String {
    let mut out = String::new();
    for (from, e) in cycle {
        out.push_str(&format!(
            "\n    {} → {}   ({})",
            show(from),
            show(&e.to),
            e.at
        ));
    }
    out
}

/// The workspace's directory.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace dir")
}

/// Every crate root of the workspace: (crate name, root file relative to the
/// workspace).
fn workspace_roots() -> Vec<(String, PathBuf)> {
    let ws = workspace();
    let mut roots = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(ws.join("crates"))
        .expect("crates/")
        .map(|e| e.expect("crates/ entry").path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .map(|p| {
            p.strip_prefix(&ws)
                .expect("below the workspace")
                .to_path_buf()
        })
        .collect();
    dirs.sort();
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let src = dir.join("src");
        for (what, file) in [("lib", src.join("lib.rs")), ("main", src.join("main.rs"))] {
            if ws.join(&file).is_file() {
                roots.push((format!("{name} ({what})"), file));
            }
        }
        if let Ok(bins) = std::fs::read_dir(ws.join(&src).join("bin")) {
            for bin in bins.flatten().map(|e| e.path()) {
                let bin = bin.strip_prefix(&ws).unwrap_or(&bin).to_path_buf();
                let file = if ws.join(&bin).is_dir() {
                    bin.join("main.rs")
                } else {
                    bin.clone()
                };
                roots.push((format!("{name} (bin {})", bin.display()), file));
            }
        }
    }
    roots
}

/// Crate roots that still have cycles (issue 13 is under way): a ratchet. A cycle in
/// any other crate fails the test, and so does a listed crate that has none any more
/// (take it off the list).
const STILL_CYCLIC: &[&str] = &[];

#[test]
fn no_workspace_crate_has_a_module_import_cycle() {
    let ws = workspace();
    let read = |p: &Path| std::fs::read_to_string(ws.join(p)).ok();
    let roots = workspace_roots();
    assert!(roots.len() >= 10, "found only {roots:?}");
    let mut report = String::new();
    let mut known = String::new();
    let mut clean_now = Vec::new();
    let mut modules = 0;
    for (name, root) in roots {
        let g = read_crate(&root, &read).unwrap_or_else(|e| panic!("{name}: {e}"));
        modules += g.modules.len();
        let cycles = g.cycles();
        let listed = STILL_CYCLIC.contains(&name.as_str());
        if listed && cycles.is_empty() {
            clean_now.push(name.clone());
        }
        for cycle in cycles {
            let line = format!("\n  {name}:{}", describe(&cycle));
            if listed {
                known.push_str(&line);
            } else {
                report.push_str(&line);
            }
        }
    }
    assert!(modules > 100, "only {modules} modules read");
    if !known.is_empty() {
        eprintln!("cycles still to remove (STILL_CYCLIC):{known}");
    }
    if !report.is_empty() {
        panic!("module import cycles (each step: module → module it uses, where):{report}");
    }
    assert!(
        clean_now.is_empty(),
        "no cycle left in {clean_now:?}: take them off STILL_CYCLIC"
    );
}

// The rule itself, on small trees.

fn cycles_of(files: &[(&str, &str)]) -> Vec<String> {
    let files: BTreeMap<PathBuf, String> = files
        .iter()
        .map(|(p, s)| (PathBuf::from(p), (*s).to_owned()))
        .collect();
    let read = |p: &Path| files.get(p).cloned();
    let g = read_crate(Path::new("src/lib.rs"), &read).expect("tree reads");
    g.cycles()
        .iter()
        .map(|c| {
            c.iter()
                .map(|(m, _)| show(m))
                .collect::<Vec<_>>()
                .join(" → ")
        })
        .collect()
}

#[test]
fn a_child_using_its_parents_items_is_not_a_cycle() {
    let found = cycles_of(&[
        ("src/lib.rs", "mod foo;"),
        ("src/foo.rs", "mod bar;\npub struct Item;"),
        ("src/foo/bar.rs", "use super::*;\nfn f(_: Item) {}"),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_parent_using_its_childs_items_back_is_a_cycle() {
    let found = cycles_of(&[
        ("src/lib.rs", "mod foo;"),
        (
            "src/foo.rs",
            "mod bar;\npub struct Item;\nfn g() { bar::helper() }",
        ),
        ("src/foo/bar.rs", "use super::Item;\npub fn helper() {}"),
    ]);
    assert_eq!(found, ["crate::foo → crate::foo::bar"]);
}

#[test]
fn a_re_export_of_a_childs_items_is_not_a_use_of_them() {
    let found = cycles_of(&[
        ("src/lib.rs", "mod foo;"),
        (
            "src/foo.rs",
            "mod bar;\npub(crate) use bar::helper;\npub struct Item;",
        ),
        ("src/foo/bar.rs", "use super::Item;\npub fn helper() {}"),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn siblings_naming_each_other_through_use_groups_are_a_cycle() {
    let found = cycles_of(&[
        ("src/lib.rs", "mod a;\nmod b;\nmod c;"),
        ("src/a.rs", "use crate::{c::X, b::{self, Y as Z}};"),
        ("src/b.rs", "pub struct Y;\nfn f() { super::a::go() }"),
        ("src/c.rs", "pub struct X;"),
    ]);
    assert_eq!(found, ["crate::a → crate::b"]);
}

#[test]
fn a_cycle_is_named_step_by_step_through_every_module_on_it() {
    let found = cycles_of(&[
        ("src/lib.rs", "pub mod a;\npub mod b;\npub mod c;"),
        ("src/a.rs", "use crate::b::Y;"),
        (
            "src/b.rs",
            "pub use self::inner::Y;\nfn h() { inner::z() }\nmod inner { pub struct Y; pub fn z() {} use crate::c; }",
        ),
        ("src/c.rs", "pub fn f() { crate::a::g() }"),
    ]);
    assert_eq!(found, ["crate::a → crate::b → crate::b::inner → crate::c"]);
}

#[test]
fn paths_in_comments_and_strings_are_not_uses() {
    let found = cycles_of(&[
        ("src/lib.rs", "mod a;\nmod b;"),
        (
            "src/a.rs",
            "/// See [`crate::b::Y`].\n// crate::b::Y\n/* crate::b /* nested */ crate::b */\n\
             fn f() -> &'static str { let _c = 'x'; r#\"crate::b::Y\"# }",
        ),
        ("src/b.rs", "pub struct Y;\nfn g() { crate::a::f(); }"),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn an_inline_test_module_is_a_module_of_its_own() {
    // The tests of `a` use `b`, which uses `a`: no cycle of `a` itself.
    let found = cycles_of(&[
        ("src/lib.rs", "mod a;\nmod b;"),
        (
            "src/a.rs",
            "pub fn f() {}\n#[cfg(test)]\nmod tests { use super::*; use crate::b::g; }",
        ),
        ("src/b.rs", "pub fn g() { crate::a::f() }"),
    ]);
    assert!(found.is_empty(), "{found:?}");
}
