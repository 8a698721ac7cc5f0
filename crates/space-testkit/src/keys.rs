//! Fixed keys (the control plane's trust anchor and signing keys, a receiver's
//! installed bundle) and a builder of signed capabilities.

use space_identity::{
    Access, AccessSet, BundleSigner, CapabilitySigner, Claims, InstalledKeys, KeyBundle, KeyUses,
    Purpose, Route, ServicePort, SignedKeyBundle, Timestamp, Token, TokenId,
};

use crate::clock::T0;
use crate::ids::bytes16;

/// The control plane's keys and a receiver's installed bundle, from fixed seeds.
#[derive(Debug)]
pub struct TestKeys {
    /// Signs key bundles (trust anchor).
    pub anchor: BundleSigner,
    /// Signs control capabilities.
    pub control: CapabilitySigner,
    /// Signs service-port capabilities.
    pub service_port: CapabilitySigner,
    /// A receiver with bundle version 1 holding both keys, valid for a day around T0.
    pub installed: InstalledKeys,
}

impl Default for TestKeys {
    fn default() -> Self {
        Self::new()
    }
}

impl TestKeys {
    /// Fixed keys, bundle installed.
    pub fn new() -> Self {
        let anchor = BundleSigner::from_seed([1; 32]);
        let installed = InstalledKeys::new(anchor.anchor());
        let mut keys = Self {
            anchor,
            control: CapabilitySigner::from_seed([2; 32]),
            service_port: CapabilitySigner::from_seed([3; 32]),
            installed,
        };
        let bundle = keys.bundle(1, &[&keys.control, &keys.service_port]);
        keys.installed
            .install(&bundle)
            .expect("fixture bundle installs");
        keys
    }

    /// A signed bundle of `version` listing `signers`, each valid for a day around T0;
    /// the control key may sign control capabilities, every other key service ports.
    pub fn bundle(&self, version: u64, signers: &[&CapabilitySigner]) -> SignedKeyBundle {
        let keys = signers
            .iter()
            .map(|s| {
                let uses = if s.key_id() == self.control.key_id() {
                    KeyUses::only(Purpose::Control)
                } else {
                    KeyUses::only(Purpose::ServicePort)
                };
                s.bundle_key(uses, T0.minus_secs(86_400), T0.plus_secs(86_400))
            })
            .collect();
        self.anchor
            .sign(&KeyBundle {
                version,
                issued_at: T0,
                keys,
            })
            .expect("fixture bundle signs")
    }
}

/// Builds capability claims with sensible defaults: a control capability for `route`
/// granting exec, fs_read and fs_write, issued at T0, valid 120 s.
#[derive(Debug, Clone)]
pub struct CapabilityBuilder {
    claims: Claims,
}

impl CapabilityBuilder {
    /// Defaults for `route`, to be signed by `keys.control`.
    pub fn control(keys: &TestKeys, route: &Route) -> Self {
        Self {
            claims: Claims {
                key_id: keys.control.key_id(),
                route: route.clone(),
                access: AccessSet::of(&[Access::Exec, Access::FsRead, Access::FsWrite]),
                purpose: Purpose::Control,
                service_port: None,
                issued_at: T0,
                expires_at: T0.plus_secs(120),
                token_id: TokenId::from_bytes(bytes16(0x70, 1)),
            },
        }
    }

    /// A service-port capability for `route`, `port` and `protocol`.
    pub fn service_port(keys: &TestKeys, route: &Route, port: ServicePort) -> Self {
        let mut b = Self::control(keys, route);
        b.claims.key_id = keys.service_port.key_id();
        b.claims.purpose = Purpose::ServicePort;
        b.claims.access = AccessSet::of(&[Access::ServicePort]);
        b.claims.service_port = Some(port);
        b
    }

    /// Replaces the access set.
    pub fn access(mut self, access: &[Access]) -> Self {
        self.claims.access = AccessSet::of(access);
        self
    }

    /// Sets issue and expiry times.
    pub fn times(mut self, issued_at: Timestamp, expires_at: Timestamp) -> Self {
        self.claims.issued_at = issued_at;
        self.claims.expires_at = expires_at;
        self
    }

    /// Sets the token ID.
    pub fn token_id(mut self, n: u64) -> Self {
        self.claims.token_id = TokenId::from_bytes(bytes16(0x70, n));
        self
    }

    /// Edits the claims directly.
    pub fn with(mut self, edit: impl FnOnce(&mut Claims)) -> Self {
        edit(&mut self.claims);
        self
    }

    /// The claims as built.
    pub fn claims(&self) -> &Claims {
        &self.claims
    }

    /// Signs with `signer`.
    pub fn sign_with(&self, signer: &CapabilitySigner) -> Token {
        signer.sign(&self.claims).expect("fixture claims sign")
    }

    /// Signs with the key its purpose calls for.
    pub fn sign(&self, keys: &TestKeys) -> Token {
        match self.claims.purpose {
            Purpose::Control => self.sign_with(&keys.control),
            Purpose::ServicePort => self.sign_with(&keys.service_port),
        }
    }
}
