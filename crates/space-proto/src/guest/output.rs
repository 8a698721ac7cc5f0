//! The cap on one output stream of a non-streaming exec.
//!
//! The output of such an exec ends up as a JSON string (lossy UTF-8) in the answer of
//! `POST /v1/sandboxes/{id}/exec`. What grows with the output is that string, not the
//! raw bytes: a NUL byte becomes `\u0000` (six bytes), an invalid byte U+FFFD (three).
//! So the cap counts *encoded* bytes — the length of the stream's JSON string without
//! its quotes, exactly as `serde_json` writes it after `String::from_utf8_lossy` — and
//! a stream's share of the answer is at most its cap, whatever the bytes are. For text
//! (printable ASCII, valid UTF-8) encoded and raw sizes are the same.
//!
//! [`OutputCap`] is applied by the agent (which reads and discards what does not fit,
//! so the child never blocks on a full pipe) and again by the collecting client, so a
//! misbehaving agent cannot make the host hold more either. It passes bytes through in
//! whole units (a character, or one run that lossy decoding replaces with U+FFFD), and
//! holds back an incomplete character at the end of a chunk until the next chunk says
//! what it is: the concatenation of what it emitted decodes to the same text as the
//! same bytes seen in one piece.

/// Length of `c` in a JSON string as `serde_json` writes it.
pub const fn json_char_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        '\0'..='\u{1f}' => 6,
        _ => c.len_utf8(),
    }
}

/// Length of `s` in a JSON string (without the quotes) as `serde_json` writes it.
pub fn json_str_len(s: &str) -> usize {
    s.chars().map(json_char_len).sum()
}

/// Length of U+FFFD, which lossy decoding puts for each invalid run.
const REPLACEMENT_LEN: usize = 3;

/// Caps one output stream at a budget of JSON-encoded bytes.
#[derive(Clone, Debug)]
pub struct OutputCap {
    limit: u64,
    used: u64,
    /// The tail of the last chunk that may be the start of a character (≤ 3 bytes).
    held: Vec<u8>,
    truncated: bool,
}

impl OutputCap {
    /// A cap of `limit` encoded bytes.
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            used: 0,
            held: Vec::new(),
            truncated: false,
        }
    }

    /// Whether output was dropped.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// Encoded bytes let through so far.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Appends to `out` the part of `chunk` that fits (a prefix, in whole units). Once
    /// something did not fit, everything after it is dropped.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        if self.truncated || chunk.is_empty() {
            return;
        }
        if self.held.is_empty() {
            self.take(chunk, false, out);
        } else {
            let mut data = std::mem::take(&mut self.held);
            data.extend_from_slice(chunk);
            self.take(&data, false, out);
        }
    }

    /// The stream ended: lets through the held tail if it fits.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if !self.held.is_empty() && !self.truncated {
            let data = std::mem::take(&mut self.held);
            self.take(&data, true, out);
        }
    }

    fn take(&mut self, data: &[u8], last: bool, out: &mut Vec<u8>) {
        let mut pos = 0usize;
        let mut chunks = data.utf8_chunks().peekable();
        while let Some(chunk) = chunks.next() {
            for (i, c) in chunk.valid().char_indices() {
                if !self.fits(json_char_len(c)) {
                    out.extend_from_slice(&data[..pos + i]);
                    return self.cut();
                }
            }
            pos += chunk.valid().len();
            let invalid = chunk.invalid();
            if invalid.is_empty() {
                continue;
            }
            // An invalid run at the very end may be a character cut by the chunk
            // boundary: what it is depends on the bytes that follow.
            if !last && chunks.peek().is_none() {
                out.extend_from_slice(&data[..pos]);
                self.held.extend_from_slice(invalid);
                return;
            }
            if !self.fits(REPLACEMENT_LEN) {
                out.extend_from_slice(&data[..pos]);
                return self.cut();
            }
            pos += invalid.len();
        }
        out.extend_from_slice(&data[..pos]);
    }

    fn fits(&mut self, n: usize) -> bool {
        let n = n as u64;
        if self.used + n > self.limit {
            return false;
        }
        self.used += n;
        true
    }

    fn cut(&mut self) {
        self.truncated = true;
        self.held.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON string of `bytes` as the worker writes it, without quotes.
    fn encoded(bytes: &[u8]) -> String {
        let s = serde_json::to_string(&String::from_utf8_lossy(bytes)).unwrap();
        s[1..s.len() - 1].to_owned()
    }

    fn capped(limit: u64, chunks: &[&[u8]]) -> (Vec<u8>, OutputCap) {
        let mut cap = OutputCap::new(limit);
        let mut out = Vec::new();
        for c in chunks {
            cap.push(c, &mut out);
        }
        cap.finish(&mut out);
        (out, cap)
    }

    #[test]
    fn json_lengths_match_serde_json() {
        let all: Vec<u8> = (0..=255u8).collect();
        let text = String::from_utf8_lossy(&all);
        assert_eq!(json_str_len(&text), encoded(&all).len());
        for s in [
            "plain",
            "quote\" back\\slash",
            "tab\tnl\n",
            "é€😀",
            "\u{7f}\u{2028}",
        ] {
            assert_eq!(json_str_len(s), encoded(s.as_bytes()).len(), "{s:?}");
        }
    }

    #[test]
    fn nul_bytes_count_as_their_escape() {
        let zeros = vec![0u8; 1000];
        let (out, cap) = capped(600, &[&zeros]);
        assert_eq!(out.len(), 100);
        assert_eq!(encoded(&out).len(), 600);
        assert!(cap.truncated());
    }

    #[test]
    fn text_under_the_cap_passes_whole_and_untruncated() {
        let text = "héllo wörld €😀\n".repeat(50);
        let bytes = text.as_bytes();
        // Split everywhere, including inside characters.
        let chunks: Vec<&[u8]> = bytes.chunks(7).collect();
        let (out, cap) = capped(encoded(bytes).len() as u64, &chunks);
        assert_eq!(out, bytes);
        assert!(!cap.truncated());
        assert_eq!(cap.used() as usize, encoded(bytes).len());
    }

    #[test]
    fn a_cut_never_splits_a_character_and_stays_under_the_cap() {
        let text = "a€😀\u{0}\"".repeat(40);
        let bytes = text.as_bytes();
        for limit in 0..60u64 {
            for size in [1, 2, 3, 5, 64] {
                let chunks: Vec<&[u8]> = bytes.chunks(size).collect();
                let (out, cap) = capped(limit, &chunks);
                assert!(
                    std::str::from_utf8(&out).is_ok(),
                    "limit {limit} size {size}"
                );
                let n = encoded(&out).len() as u64;
                assert!(n <= limit, "{n} > {limit}");
                // Nothing that would have fitted was dropped: the next unit is ≤ 6.
                assert!(n + 6 > limit, "{n} for limit {limit}");
                assert!(cap.truncated());
            }
        }
    }

    #[test]
    fn invalid_bytes_are_counted_as_they_decode_across_chunks() {
        // Invalid runs, a truncated sequence at the end, and valid characters split
        // across chunks: the emitted bytes decode exactly as the whole input does.
        let bytes: &[u8] = b"\xff\xfeab\xe2\x82\xacc\xe2\x82d\xf0\x9f\x98\x80\xf0\x9f";
        for size in 1..bytes.len() {
            let chunks: Vec<&[u8]> = bytes.chunks(size).collect();
            let (out, cap) = capped(1 << 20, &chunks);
            assert_eq!(out, bytes, "chunks of {size}");
            assert_eq!(cap.used() as usize, encoded(bytes).len());
            assert!(!cap.truncated());
        }
        for limit in 0..40u64 {
            let (out, _) = capped(limit, &[bytes]);
            assert!(bytes.starts_with(&out));
            assert!(encoded(&out).len() as u64 <= limit);
        }
    }

    #[test]
    fn after_a_cut_everything_is_dropped() {
        let mut cap = OutputCap::new(4);
        let mut out = Vec::new();
        cap.push(b"abcdef", &mut out);
        cap.push(b"g", &mut out);
        cap.finish(&mut out);
        assert_eq!(out, b"abcd");
        assert!(cap.truncated());
    }
}
