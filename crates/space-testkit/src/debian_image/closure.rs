//! Which installed packages an image of some of them needs: `dpkg-query -W` read
//! ([`parse_installed`]) and the closure of their relations over what is installed
//! ([`closure`]). Pure: the host is read by [`super`].

use std::collections::{BTreeSet, HashMap};

/// What a package of the host's says of itself (`dpkg-query -W`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub name: String,
    pub arch: String,
    pub essential: bool,
    /// Its `Pre-Depends` and `Depends`, as written (groups separated by `,`,
    /// alternatives by `|`).
    pub depends: String,
    /// The names it provides.
    pub provides: Vec<String>,
}

impl Installed {
    /// `name:arch`, as dpkg names a package of an architecture.
    pub fn key(&self) -> String {
        format!("{}:{}", self.name, self.arch)
    }

    /// How `dpkg-query` names it: `name:arch`, or `name` for `all`.
    pub(super) fn query_name(&self) -> String {
        if self.arch == "all" {
            self.name.clone()
        } else {
            self.key()
        }
    }
}

/// The `dpkg-query -W` format [`parse_installed`] reads.
pub(super) const QUERY_FORMAT: &str = "${Package}\t${Architecture}\t${Essential}\t${db:Status-Abbrev}\t\
                            ${Provides}\t${Pre-Depends}, ${Depends}\n";

/// The packages of `dpkg-query -W -f QUERY_FORMAT` output that are installed (`ii`).
pub fn parse_installed(text: &str) -> Vec<Installed> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            let [name, arch, essential, status, provides, depends] = f[..] else {
                return None;
            };
            (status.trim() == "ii").then(|| Installed {
                name: name.to_owned(),
                arch: arch.to_owned(),
                essential: essential == "yes",
                depends: depends.to_owned(),
                provides: provides
                    .split(',')
                    .map(dependency_name)
                    .filter(|n| !n.is_empty())
                    .map(str::to_owned)
                    .collect(),
            })
        })
        .collect()
}

/// The package name of one alternative of a relation (`libc6:any (>= 2.34)` →
/// `libc6`).
fn dependency_name(alternative: &str) -> &str {
    let word = alternative
        .trim()
        .split([' ', '(', '[', '<'])
        .next()
        .unwrap_or("");
    word.split(':').next().unwrap_or("")
}

/// The packages of `installed` that `roots` (names) need, themselves included: the
/// closure of their `Pre-Depends` and `Depends`, each group satisfied by its first
/// alternative that is installed — a package of that name (of the `native`
/// architecture, else `all`, else any) or, failing one, the first that provides it.
/// Indices into `installed`, sorted. A root or a group that nothing installed
/// satisfies is an error naming it.
pub fn closure(
    installed: &[Installed],
    roots: &[&str],
    native: &str,
) -> Result<Vec<usize>, String> {
    let mut by_name: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut providers: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, p) in installed.iter().enumerate() {
        by_name.entry(&p.name).or_default().push(i);
        for v in &p.provides {
            providers.entry(v).or_default().push(i);
        }
    }
    let rank = |i: &usize| match installed[*i].arch.as_str() {
        a if a == native => 0,
        "all" => 1,
        _ => 2,
    };
    let pick = |name: &str| -> Option<usize> {
        if let Some(found) = by_name.get(name) {
            return found.iter().copied().min_by_key(rank);
        }
        providers
            .get(name)
            .and_then(|p| p.iter().copied().min_by_key(|i| (rank(i), *i)))
    };
    let mut chosen = BTreeSet::new();
    let mut todo = Vec::new();
    for root in roots {
        todo.push(pick(root).ok_or_else(|| format!("{root} is not installed"))?);
    }
    while let Some(i) = todo.pop() {
        if !chosen.insert(i) {
            continue;
        }
        for group in installed[i].depends.split(',') {
            if group.trim().is_empty() {
                continue;
            }
            let met = group.split('|').find_map(|alt| pick(dependency_name(alt)));
            match met {
                Some(j) => todo.push(j),
                None => {
                    return Err(format!(
                        "{}'s dependency {:?} is not installed",
                        installed[i].key(),
                        group.trim()
                    ));
                }
            }
        }
    }
    Ok(chosen.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkg(name: &str, arch: &str, depends: &str, provides: &[&str]) -> Installed {
        Installed {
            name: name.into(),
            arch: arch.into(),
            essential: false,
            depends: depends.into(),
            provides: provides.iter().map(|p| (*p).to_owned()).collect(),
        }
    }

    fn names(installed: &[Installed], roots: &[&str]) -> Result<Vec<String>, String> {
        closure(installed, roots, "amd64")
            .map(|v| v.into_iter().map(|i| installed[i].key()).collect())
    }

    #[test]
    fn installed_packages_are_read_with_their_relations_and_others_are_not() {
        let text = "apt\tamd64\tno\tii \t\t, libc6 (>= 2.34), gpgv | gpgv2\n\
                    dash\tamd64\tyes\tii \tsh\tdebianutils (>= 5.6-0.1), \n\
                    gone\tamd64\tno\trc \t\t, \n\
                    mawk\tamd64\tno\tii \tawk, nawk (= 1.0)\tlibc6 (>= 2.29), \n";
        let got = parse_installed(text);
        assert_eq!(
            got.iter().map(Installed::key).collect::<Vec<_>>(),
            ["apt:amd64", "dash:amd64", "mawk:amd64"]
        );
        assert!(got[1].essential && !got[0].essential);
        assert_eq!(got[2].provides, ["awk", "nawk"]);
        assert_eq!(got[0].depends, ", libc6 (>= 2.34), gpgv | gpgv2");
    }

    #[test]
    fn the_closure_takes_the_first_installed_alternative_and_providers_of_virtual_names() {
        let installed = [
            pkg(
                "apt",
                "amd64",
                ", libc6:any (>= 2.34), gpgv2 | gpgv, awk",
                &[],
            ),
            pkg("libc6", "i386", "", &[]),
            pkg("libc6", "amd64", "libgcc-s1", &[]),
            pkg("libgcc-s1", "amd64", "", &[]),
            pkg("gpgv", "amd64", "", &[]),
            pkg("mawk", "amd64", "libc6", &["awk"]),
            pkg("unrelated", "all", "", &[]),
        ];
        assert_eq!(
            names(&installed, &["apt"]).unwrap(),
            [
                "apt:amd64",
                "libc6:amd64",
                "libgcc-s1:amd64",
                "gpgv:amd64",
                "mawk:amd64"
            ]
        );
    }

    #[test]
    fn a_dependency_nothing_installed_satisfies_is_named() {
        let installed = [
            pkg("apt", "amd64", "libc6, gpgv | gpgv2", &[]),
            pkg("libc6", "amd64", "", &[]),
        ];
        let err = names(&installed, &["apt"]).unwrap_err();
        assert!(
            err.contains("apt:amd64") && err.contains("gpgv | gpgv2"),
            "{err}"
        );
        assert!(names(&installed, &["nano"]).unwrap_err().contains("nano"));
    }
}
