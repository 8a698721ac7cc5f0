//! Feeds arbitrary bytes (and their text form) to the capability verifier. The
//! receiver holds a real key so inputs that guess the key ID reach the signature and
//! time checks too. Run: `cargo +nightly fuzz run capability_decode` from `fuzz/`.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use space_identity::{
    BundleSigner, CapabilitySigner, InstalledKeys, KeyBundle, KeyUses, Timestamp, Token,
    verify_capability,
};

const NOW: Timestamp = Timestamp::from_unix_secs(1_795_996_800);

fn keys() -> &'static InstalledKeys {
    static KEYS: OnceLock<InstalledKeys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let anchor = BundleSigner::from_seed([1; 32]);
        let signer = CapabilitySigner::from_seed([2; 32]);
        let bundle = anchor
            .sign(&KeyBundle {
                version: 1,
                issued_at: NOW,
                keys: vec![signer.bundle_key(KeyUses::all(), NOW.minus_secs(60), NOW.plus_secs(60))],
            })
            .expect("bundle signs");
        let mut installed = InstalledKeys::new(anchor.anchor());
        installed.install(&bundle).expect("bundle installs");
        installed
    })
}

fuzz_target!(|data: &[u8]| {
    let _ = verify_capability(data, keys(), NOW);
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(token) = Token::from_text(text) {
            let _ = verify_capability(token.as_bytes(), keys(), NOW);
        }
    }
});
