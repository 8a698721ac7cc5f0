//! Random bytes from the kernel, for secrets and nonces a test sends to real daemons.

/// `N` random bytes.
pub fn random<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    let mut filled = 0;
    while filled < N {
        filled +=
            rustix::rand::getrandom(&mut out[filled..], rustix::rand::GetRandomFlags::empty())
                .expect("getrandom");
    }
    out
}

/// 128 random bits.
pub fn rand_u128() -> u128 {
    u128::from_le_bytes(random())
}
