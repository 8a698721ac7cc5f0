//! What the driver tells Firecracker: its command line, the API requests of a boot
//! (in order) and of a pause, a resume, a snapshot and a restore, and the file names
//! inside an execution's Firecracker directory. Pure: built and tested here, sent by
//! the driver ([`super::FirecrackerDriver`]).
//!
//! Every path Firecracker is given is relative to its working directory, the
//! execution's own directory ([`DIR_PREFIX`]): a snapshot records the drives' and the
//! vsock socket's paths and a restore reopens exactly those (Firecracker cannot rename
//! a resource at load), so names that are the same in every execution by construction
//! make a snapshot restorable in any execution directory, on any worker.

use serde_json::{Value, json};

use space_proto::vm;

/// Prefix of an execution's Firecracker directory in its run directory
/// (`<data>/run/<sandbox>/fc-<execution>/`): Firecracker's working directory.
pub const DIR_PREFIX: &str = "fc-";
/// Firecracker's API socket (`--api-sock`).
pub const API_SOCKET: &str = "api.sock";
/// The hybrid vsock socket (`uds_path`): the bridge's transport.
pub const VSOCK_SOCKET: &str = "v.sock";
/// The writable disk.
pub const UPPER: &str = "upper.ext4";
/// A snapshot's state and memory as a restore loads them (links of the snapshot's
/// files, removed once loaded).
pub const VMSTATE: &str = "vmstate";
/// See [`VMSTATE`].
pub const MEMORY: &str = "memory";
/// A snapshot's state and memory while Firecracker writes them (moved into the
/// snapshot's directory once written): never the names a load read, which could still
/// be links of another snapshot's files.
pub const NEW_VMSTATE: &str = "new.vmstate";
/// See [`NEW_VMSTATE`].
pub const NEW_MEMORY: &str = "new.memory";

/// Layer `i`'s image in the directory (a hard link of the shared, read-only image).
pub fn layer_file(i: usize) -> String {
    format!("layer{i}.ext4")
}

/// The drive ID of layer `i` (`[A-Za-z0-9_]`, as Firecracker wants it).
pub fn layer_drive(i: usize) -> String {
    format!("layer{i}")
}

/// The writable disk's drive ID.
pub const UPPER_DRIVE: &str = "upper";

/// Firecracker's instance ID for an execution: its sandbox and execution IDs with
/// every character Firecracker refuses in an ID (anything but ASCII letters, digits
/// and `-`) made a `-`, at most 64 characters. For its logs only: nothing is found by it.
pub fn instance_id(sandbox_id: &str, execution_id: &str) -> String {
    format!("{sandbox_id}-{execution_id}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(64)
        .collect()
}

/// Firecracker's arguments: its API socket and its instance ID ([`instance_id`]).
/// Nothing else: its seccomp filters stay on (the default), and the guest's console
/// (its stdout) goes nowhere.
pub fn command_args(instance_id: &str) -> Vec<String> {
    vec![
        "--api-sock".into(),
        API_SOCKET.into(),
        "--id".into(),
        instance_id.into(),
    ]
}

/// The guest kernel's command line: the initramfs's `/init` as QEMU's guests have it,
/// the agent over vsock and the disks by order (Firecracker names no disk by serial;
/// see `space_proto::vm`). `reboot=k` and `panic=-1`: a guest that ends resets the
/// keyboard controller, on which Firecracker exits.
pub fn boot_args(layers: usize) -> String {
    format!(
        "console=ttyS0 quiet reboot=k panic=-1 pci=off rdinit=/init random.trust_cpu=on \
         {}={layers} {}={} {}=order",
        vm::LAYERS_PARAM,
        vm::TRANSPORT_PARAM,
        vm::GuestTransport::Vsock.as_str(),
        vm::DISKS_PARAM,
    )
}

/// One request: method, path, body.
pub type Request = (&'static str, String, Value);

/// The requests of a boot, in order: the machine, the kernel and initramfs, each layer
/// read-only then the writable disk (the order the guest takes them in), the vsock
/// device, and the start.
pub fn boot(ram: u64, cpus: u32, kernel: &str, initrd: &str, layers: usize) -> Vec<Request> {
    let mut out: Vec<Request> = vec![
        (
            "PUT",
            "/machine-config".into(),
            json!({ "vcpu_count": cpus, "mem_size_mib": ram >> 20, "smt": false }),
        ),
        (
            "PUT",
            "/boot-source".into(),
            json!({
                "kernel_image_path": kernel,
                "initrd_path": initrd,
                "boot_args": boot_args(layers),
            }),
        ),
    ];
    for i in 0..layers {
        out.push(drive(&layer_drive(i), &layer_file(i), true));
    }
    out.push(drive(UPPER_DRIVE, UPPER, false));
    out.push((
        "PUT",
        "/vsock".into(),
        json!({ "guest_cid": vm::GUEST_CID, "uds_path": VSOCK_SOCKET }),
    ));
    out.push(instance_start());
    out
}

fn drive(id: &str, path: &str, read_only: bool) -> Request {
    (
        "PUT",
        format!("/drives/{id}"),
        json!({
            "drive_id": id,
            "path_on_host": path,
            "is_root_device": false,
            "is_read_only": read_only,
        }),
    )
}

fn instance_start() -> Request {
    (
        "PUT",
        "/actions".into(),
        json!({ "action_type": "InstanceStart" }),
    )
}

/// Pauses (`true`) or resumes the guest's vCPUs.
pub fn vm_state(paused: bool) -> Request {
    (
        "PATCH",
        "/vm".into(),
        json!({ "state": if paused { "Paused" } else { "Resumed" } }),
    )
}

/// A full snapshot of a paused VM into [`NEW_VMSTATE`] and [`NEW_MEMORY`].
pub fn snapshot_create() -> Request {
    (
        "PUT",
        "/snapshot/create".into(),
        json!({
            "snapshot_type": "Full",
            "snapshot_path": NEW_VMSTATE,
            "mem_file_path": NEW_MEMORY,
        }),
    )
}

/// Loads [`VMSTATE`] and [`MEMORY`] (a private mapping of the file: the guest's
/// writes never reach it) and resumes the guest.
pub fn snapshot_load() -> Request {
    (
        "PUT",
        "/snapshot/load".into(),
        json!({
            "snapshot_path": VMSTATE,
            "mem_backend": { "backend_type": "File", "backend_path": MEMORY },
            "resume_vm": true,
        }),
    )
}

/// The oldest Firecracker the driver runs: 1.10 tells a restored guest that its vsock
/// connections were reset (firecracker PR #4796); before it the guest's agent kept
/// the old link and the bridge could not link again after a snapshot.
pub const MIN_VERSION: (u64, u64) = (1, 10);

/// Checks the body of `GET /version` (`{"firecracker_version": "1.10.1"}`): at least
/// [`MIN_VERSION`]; the version, or why not.
pub fn check_version(body: &[u8]) -> Result<String, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("GET /version: {e}"))?;
    let version = v["firecracker_version"]
        .as_str()
        .ok_or("GET /version without a firecracker_version")?;
    let mut parts = version.trim_start_matches('v').split(['.', '-']);
    let number = |p: Option<&str>| p.and_then(|p| p.parse::<u64>().ok());
    let (Some(major), Some(minor)) = (number(parts.next()), number(parts.next())) else {
        return Err(format!("Firecracker version {version:?} is not one"));
    };
    if (major, minor) < MIN_VERSION {
        return Err(format!(
            "Firecracker {version} is older than {}.{} (which tells a restored guest of \
             its vsock reset, PR #4796): upgrade it",
            MIN_VERSION.0, MIN_VERSION.1
        ));
    }
    Ok(version.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_boot_configures_machine_kernel_disks_in_guest_order_and_vsock_then_starts() {
        let reqs = boot(256 << 20, 2, "/k/vmlinux", "/d/initramfs.cpio", 2);
        let paths: Vec<&str> = reqs.iter().map(|(_, p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/machine-config",
                "/boot-source",
                "/drives/layer0",
                "/drives/layer1",
                "/drives/upper",
                "/vsock",
                "/actions"
            ]
        );
        assert!(reqs.iter().all(|(m, _, _)| *m == "PUT"));
        assert_eq!(
            reqs[0].2,
            json!({"vcpu_count": 2, "mem_size_mib": 256, "smt": false})
        );
        assert_eq!(reqs[1].2["kernel_image_path"], "/k/vmlinux");
        assert_eq!(reqs[1].2["initrd_path"], "/d/initramfs.cpio");
        // Layers read-only, the disk writable; every path relative (the same in every
        // execution, so that a snapshot's hold in its restore).
        for (i, ro) in [(2, true), (3, true), (4, false)] {
            assert_eq!(reqs[i].2["is_read_only"], ro);
            assert_eq!(reqs[i].2["is_root_device"], false);
            assert!(!reqs[i].2["path_on_host"].as_str().unwrap().starts_with('/'));
            assert_eq!(
                reqs[i].1,
                format!("/drives/{}", reqs[i].2["drive_id"].as_str().unwrap())
            );
        }
        assert_eq!(reqs[4].2["path_on_host"], UPPER);
        assert_eq!(reqs[5].2, json!({"guest_cid": 3, "uds_path": "v.sock"}));
        assert_eq!(reqs[6].2, json!({"action_type": "InstanceStart"}));
    }

    #[test]
    fn the_command_line_tells_the_guest_its_transport_and_disk_order() {
        let line = boot_args(3);
        assert_eq!(vm::layers_of_command_line(&line), Some(3));
        assert_eq!(
            vm::transport_of_command_line(&line),
            Some(vm::GuestTransport::Vsock)
        );
        assert!(vm::disks_by_order(&line));
        assert!(line.contains("rdinit=/init"));
    }

    #[test]
    fn pause_resume_snapshot_and_load_bodies() {
        assert_eq!(
            vm_state(true),
            ("PATCH", "/vm".into(), json!({"state": "Paused"}))
        );
        assert_eq!(vm_state(false).2, json!({"state": "Resumed"}));
        let (m, p, b) = snapshot_create();
        assert_eq!((m, p.as_str()), ("PUT", "/snapshot/create"));
        assert_eq!(
            b,
            json!({"snapshot_type": "Full", "snapshot_path": "new.vmstate", "mem_file_path": "new.memory"})
        );
        let (_, p, b) = snapshot_load();
        assert_eq!(p, "/snapshot/load");
        assert_eq!(
            b,
            json!({
                "snapshot_path": "vmstate",
                "mem_backend": {"backend_type": "File", "backend_path": "memory"},
                "resume_vm": true
            })
        );
    }

    #[test]
    fn firecracker_is_started_with_its_socket_and_id_only() {
        let id = instance_id("sbx_a", "00ff");
        assert_eq!(id, "sbx-a-00ff");
        assert_eq!(
            command_args(&id),
            ["--api-sock", "api.sock", "--id", "sbx-a-00ff"]
        );
        let long = instance_id(&"s".repeat(64), &"e".repeat(64));
        assert_eq!(long.len(), 64);
        assert!(long.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
        // Drive IDs are what Firecracker accepts.
        for id in [layer_drive(15), UPPER_DRIVE.to_owned()] {
            assert!(id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        }
    }

    #[test]
    fn firecracker_before_1_10_is_refused() {
        let v = |s: &str| check_version(format!("{{\"firecracker_version\": \"{s}\"}}").as_bytes());
        assert_eq!(v("1.10.1").unwrap(), "1.10.1");
        assert!(v("1.12.0-dev").is_ok());
        assert!(v("2.0.0").is_ok());
        for old in ["1.9.1", "1.7.0", "0.25.2"] {
            let err = v(old).unwrap_err();
            assert!(err.contains("older than 1.10"), "{err}");
        }
        assert!(v("banana").is_err());
        assert!(check_version(b"{}").is_err());
        assert!(check_version(b"").is_err());
    }
}
