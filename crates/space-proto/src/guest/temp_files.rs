//! The names of the agent's temporary files. A write goes to a new file beside its
//! target, then is renamed over it: a reader never sees half a write. A write cut off
//! by a snapshot (the execution frozen mid-way, its client retrying on the next
//! execution) leaves its temporary file in the layer. Snapshots leave such files out
//! ([`is_temp_name`]): 1,942 had piled up after 3,500 soak migrations, each carried
//! to the next worker and back, and every move grew slower.

/// The temporary name of a write to `target` (a file name, not a path): `pid` and `n`
/// are the writing agent's, `salt` random (a later agent has the same PID in its
/// namespace and counts from 0 again).
pub fn temp_name(target: &str, pid: u32, n: u64, salt: u64) -> String {
    format!(".{target}.space-tmp.{pid}.{n}.{salt:016x}")
}

/// Whether `name` has exactly the form [`temp_name`] gives:
/// `.TARGET.space-tmp.DIGITS.DIGITS.` and 16 lowercase hex digits.
pub fn is_temp_name(name: &[u8]) -> bool {
    const MARK: &[u8] = b".space-tmp.";
    let Some(rest) = name.strip_prefix(b".") else {
        return false;
    };
    // From the end: 16 hex digits, a dot, digits, a dot, digits, the mark.
    let Some((head, salt)) = rest.split_at_checked(rest.len().saturating_sub(16)) else {
        return false;
    };
    if salt.len() != 16 || !salt.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return false;
    }
    let Some(head) = head.strip_suffix(b".") else {
        return false;
    };
    let Some(head) = strip_digits(head).and_then(|h| h.strip_suffix(b".")) else {
        return false;
    };
    let Some(head) = strip_digits(head) else {
        return false;
    };
    head.strip_suffix(MARK)
        .is_some_and(|target| !target.is_empty())
}

/// `s` without its trailing ASCII digits, if there is at least one.
fn strip_digits(s: &[u8]) -> Option<&[u8]> {
    let digits = s.iter().rev().take_while(|b| b.is_ascii_digit()).count();
    (digits > 0).then(|| &s[..s.len() - digits])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_the_agent_gives_is_recognized() {
        for target in [
            "a",
            "notes.txt",
            ".hidden",
            "x.space-tmp.1.2.0123456789abcdef",
        ] {
            for (pid, n, salt) in [(1, 0, 0), (4_194_304, u64::MAX, u64::MAX), (7, 9, 0xabc)] {
                let name = temp_name(target, pid, n, salt);
                assert!(is_temp_name(name.as_bytes()), "{name}");
            }
        }
    }

    #[test]
    fn names_that_only_look_alike_are_a_users_files() {
        for name in [
            "notes.txt",
            ".notes.txt",
            "a.space-tmp.1.2.0123456789abcdef",
            "..space-tmp.1.2.0123456789abcdef",
            ".a.space-tmp.1.2.0123456789abcde",
            ".a.space-tmp.1.2.0123456789abcdeg",
            ".a.space-tmp.1.2.0123456789ABCDEF",
            ".a.space-tmp..2.0123456789abcdef",
            ".a.space-tmp.1..0123456789abcdef",
            ".a.space-tmp.1.2.0123456789abcdef.",
            ".a.space-tmp.12.0123456789abcdef",
            ".a.space-tmp.x.2.0123456789abcdef",
            "",
            ".",
        ] {
            assert!(!is_temp_name(name.as_bytes()), "{name}");
        }
    }
}
