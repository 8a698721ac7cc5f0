//! The wire: a 9-byte header (stream, kind, length; big-endian) and at most
//! [`MAX_PAYLOAD`] bytes. Every frame is checked before its payload is read: a length
//! over the bound, an unknown kind or a payload a kind does not carry ends the link.

use std::io::{self, Read, Write};

/// Bytes of a frame header.
pub const HEADER: usize = 9;
/// Largest payload of one frame.
pub const MAX_PAYLOAD: usize = 16 * 1024;
/// Bytes a receiver takes on a stream before it gives credit back: the most either side
/// ever buffers for one stream.
pub const WINDOW: u32 = 64 * 1024;
/// Stream 0 is the link's own (activation); streams the opener numbers start at 1.
pub const CONTROL: u32 = 0;

/// What a frame does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A new stream (only the host opens streams). No payload.
    Open,
    /// Bytes of a stream, within the receiver's window.
    Data,
    /// The sender sends no more on this stream. No payload.
    Fin,
    /// The stream is abandoned both ways. No payload.
    Reset,
    /// The receiver consumed this many more bytes (`u32`): the sender may send them.
    Credit,
    /// On stream 0: the link's control message (the activation record, host to guest;
    /// the guest's ready answer). Its payload is the message.
    Control,
}

impl Kind {
    fn to_byte(self) -> u8 {
        match self {
            Self::Open => 1,
            Self::Data => 2,
            Self::Fin => 3,
            Self::Reset => 4,
            Self::Credit => 5,
            Self::Control => 6,
        }
    }

    fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            1 => Self::Open,
            2 => Self::Data,
            3 => Self::Fin,
            4 => Self::Reset,
            5 => Self::Credit,
            6 => Self::Control,
            _ => return None,
        })
    }
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Which stream.
    pub stream: u32,
    /// What it does.
    pub kind: Kind,
    /// Its bytes (empty for kinds without a payload).
    pub payload: Vec<u8>,
}

impl Frame {
    /// A frame without a payload.
    pub fn bare(stream: u32, kind: Kind) -> Self {
        Self {
            stream,
            kind,
            payload: Vec::new(),
        }
    }

    /// A credit of `n` bytes on `stream`.
    pub fn credit(stream: u32, n: u32) -> Self {
        Self {
            stream,
            kind: Kind::Credit,
            payload: n.to_be_bytes().to_vec(),
        }
    }

    /// The credit a [`Kind::Credit`] frame grants.
    pub fn credit_value(&self) -> Option<u32> {
        let bytes: [u8; 4] = self.payload.as_slice().try_into().ok()?;
        Some(u32::from_be_bytes(bytes))
    }

    /// Header and payload, as sent.
    pub fn encode(&self) -> io::Result<Vec<u8>> {
        wire(self.stream, self.kind, &self.payload)
    }

    /// Writes the frame in one `write_all`.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        w.write_all(&self.encode()?)
    }
}

/// A frame's bytes as sent, from its parts (one allocation: no [`Frame`] is built).
pub fn wire(stream: u32, kind: Kind, payload: &[u8]) -> io::Result<Vec<u8>> {
    if payload.len() > MAX_PAYLOAD {
        return Err(invalid("payload over the frame bound"));
    }
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(&stream.to_be_bytes());
    out.push(kind.to_byte());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    Ok(out)
}

fn invalid(why: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

/// Reads one frame; `None` at a clean end (EOF before a header). The header is checked
/// before the payload is read: a length over [`MAX_PAYLOAD`], an unknown kind, a
/// payload on a kind without one, a credit that is not 4 bytes, or a control frame off
/// stream 0 (or a stream frame on it) is an error.
pub fn read_frame(r: &mut impl Read) -> io::Result<Option<Frame>> {
    let mut header = [0u8; HEADER];
    let mut got = 0;
    while got < HEADER {
        match r.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "torn header")),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let stream = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    let kind = Kind::from_byte(header[4]).ok_or_else(|| invalid("unknown frame kind"))?;
    let len = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) as usize;
    if len > MAX_PAYLOAD {
        return Err(invalid("frame length over the bound"));
    }
    let fits = match kind {
        Kind::Open | Kind::Fin | Kind::Reset => len == 0,
        Kind::Credit => len == 4,
        Kind::Data | Kind::Control => true,
    };
    if !fits {
        return Err(invalid("payload length not allowed for this kind"));
    }
    if (kind == Kind::Control) != (stream == CONTROL) {
        return Err(invalid("control frames go on stream 0, and only they"));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok(Some(Frame {
        stream,
        kind,
        payload,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        for f in [
            Frame::bare(1, Kind::Open),
            Frame {
                stream: 7,
                kind: Kind::Data,
                payload: vec![9; MAX_PAYLOAD],
            },
            Frame::bare(7, Kind::Fin),
            Frame::bare(7, Kind::Reset),
            Frame::credit(7, WINDOW),
            Frame {
                stream: CONTROL,
                kind: Kind::Control,
                payload: b"{}".to_vec(),
            },
        ] {
            let bytes = f.encode().unwrap();
            let back = read_frame(&mut bytes.as_slice()).unwrap().unwrap();
            assert_eq!(back, f);
        }
        assert!(read_frame(&mut [].as_slice()).unwrap().is_none());
    }

    #[test]
    fn a_hostile_header_is_refused_before_its_payload_is_read() {
        let header = |stream: u32, kind: u8, len: u32| {
            let mut h = stream.to_be_bytes().to_vec();
            h.push(kind);
            h.extend_from_slice(&len.to_be_bytes());
            h
        };
        // A length of 4 GiB with no payload behind it: refused from the header alone.
        for bad in [
            header(1, 2, u32::MAX),
            header(1, 2, MAX_PAYLOAD as u32 + 1),
            header(1, 99, 0),
            header(1, 1, 5),
            header(1, 5, 3),
            header(1, 6, 0),
            header(0, 2, 0),
        ] {
            let e = read_frame(&mut bad.as_slice()).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{bad:?}");
        }
        let torn = &header(1, 2, 4)[..5];
        assert!(read_frame(&mut &torn[..]).is_err());
        assert!(
            Frame {
                stream: 1,
                kind: Kind::Data,
                payload: vec![0; MAX_PAYLOAD + 1]
            }
            .encode()
            .is_err()
        );
    }
}
