//! The SPACE worker: substrates that run sandbox executions (for now the `jail`
//! driver), with the node API and runtime records to come.

pub mod daemon;
pub mod egress;
pub mod substrate;
