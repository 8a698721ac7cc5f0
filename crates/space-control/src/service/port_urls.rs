//! Where service-port URLs point (a leaf of `service`: the control plane holds one).

/// How the control plane writes port URLs: the edge's domain for service ports and
/// the port the edge listens on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortUrls {
    /// `localhost` unless configured.
    pub domain: String,
    /// The edge's port.
    pub edge_port: u16,
}

impl Default for PortUrls {
    fn default() -> Self {
        Self {
            domain: "localhost".into(),
            edge_port: 7070,
        }
    }
}
