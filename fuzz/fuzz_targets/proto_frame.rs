//! Arbitrary bytes through the host ↔ guest frame reader and message decoders: none
//! may panic, and whatever decodes must re-encode to the same bytes (the codec accepts
//! one spelling per message). Run: `cargo +nightly fuzz run proto_frame` from `fuzz/`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use space_proto::codec;
use space_proto::frame::{FrameReader, read_frame};
use space_proto::guest::{self, Activation};

fuzz_target!(|data: &[u8]| {
    // As a stream of frames, read blocking and incrementally.
    let mut stream = data;
    while let Ok(body) = read_frame(&mut stream) {
        check_body(&body);
    }
    let mut reader = FrameReader::new();
    let mut stream = data;
    while let Ok(Some(body)) = reader.poll_read(&mut stream) {
        check_body(&body);
    }
    // As a body on its own.
    check_body(data);
    let _ = Activation::decode(data);
});

fn check_body(body: &[u8]) {
    let _ = guest::peek_hello_version(body);
    if let Ok(frame) = guest::decode_client_frame(body) {
        assert_eq!(codec::encode(&frame), body);
    }
    if let Ok(frame) = guest::decode_agent_frame(body) {
        assert_eq!(codec::encode(&frame), body);
    }
}
