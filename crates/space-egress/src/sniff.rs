//! The name a client asks for, read from the first bytes it sends: the SNI of a TLS
//! ClientHello, or the `Host` of an HTTP/1.x request head.
//!
//! Both read a bounded prefix and never copy more than that bound. What they return
//! is a name as the client wrote it (lowercased, port and IPv6 brackets removed); the
//! caller parses it ([`crate::DnsName::parse`], or as an address literal).

/// Most bytes [`tls_sni`] looks at: one record of 16 KiB and its 5-byte header.
pub const MAX_TLS_PEEK: usize = 16 * 1024 + 5;

/// Most bytes [`http_host`] looks at: a request head of 16 KiB.
pub const MAX_HTTP_HEAD: usize = 16 * 1024;

/// Longest host name returned.
const MAX_HOST: usize = 255;

/// What the first bytes say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sniff {
    /// The name asked for: lowercase, without a port or brackets.
    Complete(String),
    /// A well-formed ClientHello without a `host_name` SNI, or a request without `Host`.
    NoName,
    /// A prefix of what may still be a ClientHello or a request head: read more
    /// (never past the bound, where the answer is `NotThisProtocol`).
    NeedMore,
    /// Not a ClientHello / an HTTP/1.x request head, malformed, or past the bound.
    NotThisProtocol,
}

/// Reads the SNI `host_name` of the TLS ClientHello at the start of `bytes`.
///
/// The handshake message may be split over several handshake records; all of them
/// must fit in [`MAX_TLS_PEEK`] bytes.
pub fn tls_sni(bytes: &[u8]) -> Sniff {
    let bytes = &bytes[..bytes.len().min(MAX_TLS_PEEK)];
    let truncated = bytes.len() == MAX_TLS_PEEK;
    let mut handshake: Vec<u8> = Vec::new();
    let mut rest = bytes;
    loop {
        // Record header: type 22 (handshake), version 3.x, length 1..=16384.
        if rest.first().is_some_and(|&t| t != 0x16)
            || rest.get(1).is_some_and(|&major| major != 3)
            || rest.get(2).is_some_and(|&minor| minor > 4)
        {
            return Sniff::NotThisProtocol;
        }
        if rest.len() < 5 {
            return need_more(truncated);
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if len == 0 || len > 16 * 1024 {
            return Sniff::NotThisProtocol;
        }
        let fragment = &rest[5..];
        let available = &fragment[..fragment.len().min(len)];
        // The handshake type can be judged before the whole record is in.
        if handshake
            .first()
            .or(available.first())
            .is_some_and(|&t| t != 1)
        {
            return Sniff::NotThisProtocol;
        }
        // So can the handshake's length.
        let mut known = handshake.iter().chain(available).copied();
        if let (Some(_), Some(a), Some(b), Some(c)) =
            (known.next(), known.next(), known.next(), known.next())
            && (usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c)) + 4 > MAX_TLS_PEEK
        {
            return Sniff::NotThisProtocol;
        }
        if fragment.len() < len {
            return need_more(truncated);
        }
        handshake.extend_from_slice(available);
        rest = &fragment[len..];
        if handshake.len() < 4 {
            continue;
        }
        let body_len = usize::from(handshake[1]) << 16
            | usize::from(handshake[2]) << 8
            | usize::from(handshake[3]);
        if body_len + 4 > MAX_TLS_PEEK {
            return Sniff::NotThisProtocol;
        }
        if handshake.len() >= body_len + 4 {
            if handshake.len() > body_len + 4 {
                // Another handshake message in the first flight: not a client's.
                return Sniff::NotThisProtocol;
            }
            return client_hello(&handshake[4..]).unwrap_or(Sniff::NotThisProtocol);
        }
    }
}

fn need_more(truncated: bool) -> Sniff {
    if truncated {
        Sniff::NotThisProtocol
    } else {
        Sniff::NeedMore
    }
}

/// A cursor over a byte slice; every read is checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }

    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The body of a ClientHello (after its 4-byte handshake header); `None` if malformed.
fn client_hello(body: &[u8]) -> Option<Sniff> {
    let mut r = Reader(body);
    let version = r.u16()?;
    if version >> 8 != 3 {
        return None;
    }
    r.take(32)?; // random
    if r.vec8()?.len() > 32 {
        return None; // session id
    }
    let suites = r.vec16()?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return None;
    }
    if r.vec8()?.is_empty() {
        return None; // compression methods
    }
    if r.is_empty() {
        return Some(Sniff::NoName); // no extensions at all
    }
    let mut extensions = Reader(r.vec16()?);
    if !r.is_empty() {
        return None;
    }
    let mut found = None;
    let mut seen_sni = false;
    while !extensions.is_empty() {
        let kind = extensions.u16()?;
        let data = extensions.vec16()?;
        if kind != 0 {
            continue;
        }
        if seen_sni {
            return None; // an extension appears at most once
        }
        seen_sni = true;
        found = server_name(data)?;
    }
    Some(found.map_or(Sniff::NoName, Sniff::Complete))
}

/// The `server_name` extension's data: `Some(Some(name))` for a `host_name` entry,
/// `Some(None)` for a list without one, `None` if malformed.
fn server_name(data: &[u8]) -> Option<Option<String>> {
    let mut ext = Reader(data);
    let mut list = Reader(ext.vec16()?);
    if !ext.is_empty() || list.is_empty() {
        return None;
    }
    let mut host = None;
    while !list.is_empty() {
        let kind = list.u8()?;
        let name = list.vec16()?;
        if kind != 0 {
            continue;
        }
        if host.is_some() {
            return None; // at most one name of each type (RFC 6066)
        }
        host = Some(host_text(name)?);
    }
    Some(host)
}

/// A name in SNI: 1–255 printable ASCII bytes without spaces, lowercased, one
/// trailing dot allowed.
fn host_text(name: &[u8]) -> Option<String> {
    if name.is_empty() || name.len() > MAX_HOST || !name.iter().all(|b| b.is_ascii_graphic()) {
        return None;
    }
    Some(String::from_utf8_lossy(name).to_ascii_lowercase())
}

/// Reads the host of the first HTTP/1.x request head in `bytes`: the authority of an
/// absolute-form target (`GET http://host/ HTTP/1.1`) or the `Host` header.
///
/// Stricter than a server need be, since the proxy forwards the request: lines end in
/// CRLF, no obsolete line folding, exactly one `Host`, no userinfo, `CONNECT` refused,
/// and an absolute-form target whose host differs from `Host` is refused.
pub fn http_host(bytes: &[u8]) -> Sniff {
    let window = &bytes[..bytes.len().min(MAX_HTTP_HEAD)];
    let Some(end) = find(window, b"\r\n\r\n") else {
        if !request_line_prefix_ok(window) {
            return Sniff::NotThisProtocol;
        }
        return need_more(window.len() == MAX_HTTP_HEAD);
    };
    request_head(&window[..end]).unwrap_or(Sniff::NotThisProtocol)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Whether `prefix` can still begin a request line (`METHOD SP …`).
fn request_line_prefix_ok(prefix: &[u8]) -> bool {
    let method_len = prefix.iter().take_while(|&&b| is_tchar(b)).count();
    match prefix.get(method_len) {
        None => method_len <= 32,
        Some(b' ') => method_len > 0 && method_len <= 32,
        Some(_) => false,
    }
}

/// The head without its final CRLF CRLF; `None` if malformed.
fn request_head(head: &[u8]) -> Option<Sniff> {
    if head.iter().any(|&b| b == b'\r' || b == b'\n') && !well_terminated(head) {
        return None;
    }
    let mut lines = split_crlf(head);
    let request_line = lines.next()?;
    let mut parts = request_line.split(|&b| b == b' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || method.is_empty()
        || method.len() > 32
        || !method.iter().all(|&b| is_tchar(b))
        || !(version == b"HTTP/1.1" || version == b"HTTP/1.0")
        || target.is_empty()
        || method == b"CONNECT"
    {
        return None;
    }
    let mut host_header: Option<&[u8]> = None;
    for line in lines {
        let colon = line.iter().position(|&b| b == b':')?;
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return None; // also refuses obsolete folding (a line starting with SP/HT)
        }
        if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return None;
        }
        if name.eq_ignore_ascii_case(b"host") {
            if host_header.is_some() {
                return None;
            }
            host_header = Some(value.trim_ascii());
        }
    }
    let from_target = absolute_form_authority(target)?;
    let from_header = match host_header {
        Some(value) => authority_host(value)?,
        None => None,
    };
    match (from_target, from_header) {
        (Some(t), Some(h)) if t != h => None,
        (Some(t), _) => Some(Sniff::Complete(t)),
        (None, Some(h)) => Some(Sniff::Complete(h)),
        (None, None) => Some(Sniff::NoName),
    }
}

/// Every CR is followed by LF and every LF preceded by CR.
fn well_terminated(head: &[u8]) -> bool {
    head.iter().enumerate().all(|(i, &b)| match b {
        b'\r' => head.get(i + 1) == Some(&b'\n'),
        b'\n' => i > 0 && head[i - 1] == b'\r',
        _ => true,
    })
}

fn split_crlf(head: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(head);
    std::iter::from_fn(move || {
        let current = rest?;
        match find(current, b"\r\n") {
            Some(i) => {
                rest = Some(&current[i + 2..]);
                Some(&current[..i])
            }
            None => {
                rest = None;
                Some(current)
            }
        }
    })
}

/// `Some(Some(host))` for `http://host[:port]/…`, `Some(None)` for an origin-form or
/// asterisk-form target, `None` for anything else.
fn absolute_form_authority(target: &[u8]) -> Option<Option<String>> {
    if target.starts_with(b"/") || target == b"*" {
        return Some(None);
    }
    let scheme_end = find(target, b"://")?;
    if !target[..scheme_end].eq_ignore_ascii_case(b"http") {
        return None;
    }
    let rest = &target[scheme_end + 3..];
    let authority_end = rest
        .iter()
        .position(|&b| b == b'/' || b == b'?' || b == b'#')
        .unwrap_or(rest.len());
    // An absolute-form target with an empty authority is malformed.
    let host = authority_host(&rest[..authority_end])??;
    Some(Some(host))
}

/// The host of an authority (`host`, `host:port`, `[v6]`, `[v6]:port`): `Some(None)`
/// when empty, `None` when malformed.
fn authority_host(authority: &[u8]) -> Option<Option<String>> {
    if authority.is_empty() {
        return Some(None);
    }
    if authority.len() > MAX_HOST + 8 || authority.contains(&b'@') {
        return None;
    }
    let (host, port) = if let Some(inner) = authority.strip_prefix(b"[") {
        let close = inner.iter().position(|&b| b == b']')?;
        let after = &inner[close + 1..];
        let port = match after {
            [] => None,
            [b':', port @ ..] => Some(port),
            _ => return None,
        };
        let host = &inner[..close];
        if host.is_empty()
            || !host
                .iter()
                .all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return None;
        }
        (host, port)
    } else {
        match authority.iter().rposition(|&b| b == b':') {
            Some(i) => (&authority[..i], Some(&authority[i + 1..])),
            None => (authority, None),
        }
    };
    if let Some(port) = port
        && !(port.is_empty() || (port.len() <= 5 && port.iter().all(u8::is_ascii_digit)))
    {
        return None;
    }
    let reg_name = |b: &u8| b.is_ascii_alphanumeric() || b"-._~".contains(b);
    if host.is_empty()
        || host.len() > MAX_HOST
        || (!authority.starts_with(b"[") && !host.iter().all(reg_name))
    {
        return None;
    }
    Some(Some(String::from_utf8_lossy(host).to_ascii_lowercase()))
}

#[cfg(test)]
#[path = "sniff_tests.rs"]
mod tests;
