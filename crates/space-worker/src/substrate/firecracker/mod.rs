//! Building blocks of a Firecracker driver (issue 18's last part), each tested here:
//! the API client over the VMM's Unix socket ([`api`]); the hybrid vsock handshake
//! the bridge would use (`spaced_host::vsock`); the ELF kernel Firecracker ≤ 1.16
//! boots, made from the Debian kernel (`substrate::vm::vmlinux`).
//!
//! Not built: the driver itself (launch through `PUT /boot-source`, `/machine-config`,
//! `/drives/{id}`, `/vsock`, `InstanceStart`; pause and resume by `PATCH /vm`;
//! `snapshot/create` and `snapshot/load`), the guest's side (its agent on a vsock
//! port, its disks found by order — Firecracker gives block devices no serial of
//! the worker's choosing), and a worker substrate for it. This host class has neither
//! a `firecracker` binary nor a KVM that boots a stock kernel, so none of that could
//! run here; see the note.

pub mod api;
