//! DNS messages for the platform's resolver: parse a sandbox's query (RFC 1035, one
//! question, no compression in it, at most 512 bytes over UDP) and build its answer —
//! `NXDOMAIN` / `REFUSED` for a refused name, `A` / `AAAA` records for an allowed one.
//! [`parse_response`] reads the addresses of an answer (the tests', or an upstream's).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Largest message over UDP without EDNS; queries past it are refused and answers are
/// cut to fit.
pub const MAX_UDP_MESSAGE: usize = 512;

/// Longest encoded name (RFC 1035 §2.3.4).
pub const MAX_WIRE_NAME: usize = 255;

/// Record type `A`.
pub const TYPE_A: u16 = 1;
/// Record type `AAAA`.
pub const TYPE_AAAA: u16 = 28;
/// Class `IN`.
pub const CLASS_IN: u16 = 1;

const HEADER: usize = 12;

/// A response code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rcode {
    NoError = 0,
    FormErr = 1,
    ServFail = 2,
    NxDomain = 3,
    NotImp = 4,
    Refused = 5,
}

impl Rcode {
    fn from_bits(bits: u8) -> Option<Self> {
        Some(match bits {
            0 => Rcode::NoError,
            1 => Rcode::FormErr,
            2 => Rcode::ServFail,
            3 => Rcode::NxDomain,
            4 => Rcode::NotImp,
            5 => Rcode::Refused,
            _ => return None,
        })
    }
}

/// Why a message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnsError {
    #[error("shorter than its header or than its counts say")]
    TooShort,
    #[error("longer than {MAX_UDP_MESSAGE} bytes")]
    TooLong,
    #[error("a response where a query was expected, or the reverse")]
    WrongDirection,
    #[error("opcode {0} (only standard queries are answered)")]
    Opcode(u8),
    #[error("a truncated query")]
    Truncated,
    #[error("{0} questions (exactly one is answered)")]
    QuestionCount(u16),
    #[error("a query with answer or authority records, or more than one additional record")]
    UnexpectedRecords,
    #[error("a compressed name in a query")]
    Compression,
    #[error("a label of an unknown type")]
    LabelType,
    #[error("a name longer than {MAX_WIRE_NAME} bytes")]
    NameTooLong,
    #[error("a name with a byte that is not printable ASCII, or a dot inside a label")]
    BadName,
    #[error("bytes after the question")]
    TrailingBytes,
    #[error("response code {0} is not one this crate knows")]
    UnknownRcode(u8),
}

/// A parsed query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub id: u16,
    pub recursion_desired: bool,
    /// The name asked for: lowercase, dot-separated, no trailing dot (`""` for the root).
    pub name: String,
    pub qtype: u16,
    pub qclass: u16,
    /// The question as it was sent (its case kept, for clients that check it).
    question: Vec<u8>,
}

fn u16_at(msg: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*msg.get(at)?, *msg.get(at + 1)?]))
}

/// Parses a query received over UDP.
pub fn parse_query(msg: &[u8]) -> Result<Query, DnsError> {
    if msg.len() > MAX_UDP_MESSAGE {
        return Err(DnsError::TooLong);
    }
    if msg.len() < HEADER {
        return Err(DnsError::TooShort);
    }
    let id = u16::from_be_bytes([msg[0], msg[1]]);
    let flags = u16::from_be_bytes([msg[2], msg[3]]);
    if flags & 0x8000 != 0 {
        return Err(DnsError::WrongDirection);
    }
    let opcode = ((flags >> 11) & 0xf) as u8;
    if opcode != 0 {
        return Err(DnsError::Opcode(opcode));
    }
    if flags & 0x0200 != 0 {
        return Err(DnsError::Truncated);
    }
    let count = |i: usize| u16::from_be_bytes([msg[4 + 2 * i], msg[5 + 2 * i]]);
    let (qd, an, ns, ar) = (count(0), count(1), count(2), count(3));
    if qd != 1 {
        return Err(DnsError::QuestionCount(qd));
    }
    if an != 0 || ns != 0 || ar > 1 {
        return Err(DnsError::UnexpectedRecords);
    }
    let (name, name_end) = read_query_name(msg, HEADER)?;
    let qtype = u16_at(msg, name_end).ok_or(DnsError::TooShort)?;
    let qclass = u16_at(msg, name_end + 2).ok_or(DnsError::TooShort)?;
    let question_end = name_end + 4;
    // One additional record is allowed (EDNS's OPT) and not interpreted: answers stay
    // within 512 bytes and carry no OPT.
    if ar == 0 && msg.len() != question_end {
        return Err(DnsError::TrailingBytes);
    }
    if ar == 1 && msg.len() < question_end + 11 {
        return Err(DnsError::TooShort);
    }
    Ok(Query {
        id,
        recursion_desired: flags & 0x0100 != 0,
        name,
        qtype,
        qclass,
        question: msg[HEADER..question_end].to_vec(),
    })
}

/// Reads an uncompressed name at `at`: (lowercase text, offset after it).
fn read_query_name(msg: &[u8], mut at: usize) -> Result<(String, usize), DnsError> {
    let start = at;
    let mut name = String::new();
    loop {
        let len = *msg.get(at).ok_or(DnsError::TooShort)?;
        match len & 0xc0 {
            0x00 => {}
            0xc0 => return Err(DnsError::Compression),
            _ => return Err(DnsError::LabelType),
        }
        at += 1;
        if len == 0 {
            break;
        }
        let label = msg
            .get(at..at + usize::from(len))
            .ok_or(DnsError::TooShort)?;
        at += usize::from(len);
        if at - start > MAX_WIRE_NAME {
            return Err(DnsError::NameTooLong);
        }
        if !label.iter().all(|&b| b.is_ascii_graphic() && b != b'.') {
            return Err(DnsError::BadName);
        }
        if !name.is_empty() {
            name.push('.');
        }
        name.extend(label.iter().map(|&b| char::from(b.to_ascii_lowercase())));
    }
    if at - start > MAX_WIRE_NAME {
        return Err(DnsError::NameTooLong);
    }
    Ok((name, at))
}

fn header(id: u16, rd: bool, rcode: Rcode, qd: u16, an: u16) -> Vec<u8> {
    // QR, opcode 0, not authoritative, not truncated, RD copied, RA set.
    let flags: u16 = 0x8000 | if rd { 0x0100 } else { 0 } | 0x0080 | rcode as u16;
    let mut out = Vec::with_capacity(MAX_UDP_MESSAGE);
    out.extend(id.to_be_bytes());
    out.extend(flags.to_be_bytes());
    for n in [qd, an, 0, 0] {
        out.extend(n.to_be_bytes());
    }
    out
}

/// An answer without records: `NXDOMAIN`, `REFUSED`, or `NOERROR` with no data.
pub fn reply_without_records(query: &Query, rcode: Rcode) -> Vec<u8> {
    let mut out = header(query.id, query.recursion_desired, rcode, 1, 0);
    out.extend(&query.question);
    out
}

/// A `NOERROR` answer with an `A` record for each IPv4 address (query type `A`) or an
/// `AAAA` record for each IPv6 address (type `AAAA`), each with `ttl` seconds; other
/// addresses and types give no records. Records that would pass 512 bytes are left out.
pub fn answer(query: &Query, addrs: &[IpAddr], ttl: u32) -> Vec<u8> {
    let records: Vec<Vec<u8>> = addrs
        .iter()
        .filter(|_| query.qclass == CLASS_IN)
        .filter_map(|addr| match (query.qtype, addr) {
            (TYPE_A, IpAddr::V4(v4)) => Some(v4.octets().to_vec()),
            (TYPE_AAAA, IpAddr::V6(v6)) => Some(v6.octets().to_vec()),
            _ => None,
        })
        .collect();
    let mut body = Vec::new();
    let mut count: u16 = 0;
    let fixed = HEADER + query.question.len();
    for data in records {
        // A pointer to the question's name (offset 12), type, class, TTL, length, data.
        let size = 2 + 2 + 2 + 4 + 2 + data.len();
        if fixed + body.len() + size > MAX_UDP_MESSAGE {
            break;
        }
        body.extend([0xc0, 0x0c]);
        body.extend(query.qtype.to_be_bytes());
        body.extend(CLASS_IN.to_be_bytes());
        body.extend(ttl.to_be_bytes());
        body.extend((data.len() as u16).to_be_bytes());
        body.extend(data);
        count += 1;
    }
    let mut out = header(query.id, query.recursion_desired, Rcode::NoError, 1, count);
    out.extend(&query.question);
    out.extend(body);
    out
}

/// A header-only reply (`FORMERR`, `NOTIMP`, …) to a message that did not parse as a
/// query but starts with a query's header; `None` when there is nothing to answer.
pub fn error_reply(msg: &[u8], rcode: Rcode) -> Option<Vec<u8>> {
    if msg.len() < HEADER || msg.len() > MAX_UDP_MESSAGE || msg[2] & 0x80 != 0 {
        return None;
    }
    let id = u16::from_be_bytes([msg[0], msg[1]]);
    Some(header(id, msg[2] & 0x01 != 0, rcode, 0, 0))
}

/// Builds a standard query with recursion desired.
pub fn build_query(id: u16, name: &str, qtype: u16) -> Result<Vec<u8>, DnsError> {
    let mut out = Vec::with_capacity(HEADER + name.len() + 6);
    out.extend(id.to_be_bytes());
    out.extend(0x0100u16.to_be_bytes());
    out.extend([0, 1, 0, 0, 0, 0, 0, 0]);
    let start = out.len();
    for label in name
        .strip_suffix('.')
        .unwrap_or(name)
        .split('.')
        .filter(|l| !l.is_empty())
    {
        if label.len() > 63 {
            return Err(DnsError::NameTooLong);
        }
        if !label.bytes().all(|b| b.is_ascii_graphic() && b != b'.') {
            return Err(DnsError::BadName);
        }
        out.push(label.len() as u8);
        out.extend(label.as_bytes());
    }
    out.push(0);
    if out.len() - start > MAX_WIRE_NAME {
        return Err(DnsError::NameTooLong);
    }
    out.extend(qtype.to_be_bytes());
    out.extend(CLASS_IN.to_be_bytes());
    Ok(out)
}

/// What [`parse_response`] reads from an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub id: u16,
    pub rcode: Rcode,
    pub truncated: bool,
    /// The `A` and `AAAA` records of the answer section, with their TTLs.
    pub addresses: Vec<(IpAddr, u32)>,
}

/// Reads a response (up to 65,535 bytes: also one received over TCP); names may be
/// compressed. Records other than `A` / `AAAA` in the answer section are skipped.
pub fn parse_response(msg: &[u8]) -> Result<Response, DnsError> {
    if msg.len() > usize::from(u16::MAX) {
        return Err(DnsError::TooLong);
    }
    if msg.len() < HEADER {
        return Err(DnsError::TooShort);
    }
    let flags = u16::from_be_bytes([msg[2], msg[3]]);
    if flags & 0x8000 == 0 {
        return Err(DnsError::WrongDirection);
    }
    let rcode_bits = (flags & 0xf) as u8;
    let rcode = Rcode::from_bits(rcode_bits).ok_or(DnsError::UnknownRcode(rcode_bits))?;
    let qd = u16_at(msg, 4).ok_or(DnsError::TooShort)?;
    let an = u16_at(msg, 6).ok_or(DnsError::TooShort)?;
    let mut at = HEADER;
    for _ in 0..qd {
        at = skip_name(msg, at)? + 4;
    }
    let mut addresses = Vec::new();
    for _ in 0..an {
        at = skip_name(msg, at)?;
        let rtype = u16_at(msg, at).ok_or(DnsError::TooShort)?;
        let class = u16_at(msg, at + 2).ok_or(DnsError::TooShort)?;
        let ttl_bytes = msg.get(at + 4..at + 8).ok_or(DnsError::TooShort)?;
        let ttl = u32::from_be_bytes([ttl_bytes[0], ttl_bytes[1], ttl_bytes[2], ttl_bytes[3]]);
        let len = usize::from(u16_at(msg, at + 8).ok_or(DnsError::TooShort)?);
        let data = msg.get(at + 10..at + 10 + len).ok_or(DnsError::TooShort)?;
        at += 10 + len;
        if class != CLASS_IN {
            continue;
        }
        match (rtype, len) {
            (TYPE_A, 4) => {
                let octets: [u8; 4] = data.try_into().map_err(|_| DnsError::TooShort)?;
                addresses.push((IpAddr::V4(Ipv4Addr::from(octets)), ttl));
            }
            (TYPE_AAAA, 16) => {
                let octets: [u8; 16] = data.try_into().map_err(|_| DnsError::TooShort)?;
                addresses.push((IpAddr::V6(Ipv6Addr::from(octets)), ttl));
            }
            (TYPE_A | TYPE_AAAA, _) => return Err(DnsError::TooShort),
            _ => {}
        }
    }
    Ok(Response {
        id: u16::from_be_bytes([msg[0], msg[1]]),
        rcode,
        truncated: flags & 0x0200 != 0,
        addresses,
    })
}

/// The offset after the name at `at`; a compression pointer ends a name, so none is
/// followed and no loop is possible.
fn skip_name(msg: &[u8], mut at: usize) -> Result<usize, DnsError> {
    let start = at;
    loop {
        let len = *msg.get(at).ok_or(DnsError::TooShort)?;
        match len & 0xc0 {
            0x00 if len == 0 => return Ok(at + 1),
            0x00 => at += 1 + usize::from(len),
            0xc0 => {
                msg.get(at + 1).ok_or(DnsError::TooShort)?;
                return Ok(at + 2);
            }
            _ => return Err(DnsError::LabelType),
        }
        if at - start > MAX_WIRE_NAME {
            return Err(DnsError::NameTooLong);
        }
    }
}

#[cfg(test)]
#[path = "dns_tests.rs"]
mod tests;
