//! A sandbox on an image template: the image's layers stacked as the overlay's lower
//! dirs (whiteouts and opaque directories of an upper layer hide what lower ones
//! have), idmapped so that the image's owners are the sandbox's, the image's own
//! accounts kept, nothing of the host's system directories visible, and the agent
//! (linked statically) running from the image's root. The layers are made by hand
//! here, as the template store's unpack leaves them (see `space-image`).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use space_identity::{ExecutionId, Generation, SandboxId};
use space_proto::client::AgentConnection;
use space_proto::guest::{Activation, ExecSpec, ExitOutcome};
use space_worker::daemon::launch::{self, Binaries, LaunchError, Layer};
use space_worker::daemon::records::BridgeRecord;
use space_worker::substrate::jail::{JailConfig, JailDriver};
use space_worker::substrate::{Limits, SandboxHandle, SubstrateError, TemplateSpec};

const BUSYBOX: &str = "/bin/busybox";

fn random<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    rustix::rand::getrandom(&mut out, rustix::rand::GetRandomFlags::empty()).unwrap();
    out
}

fn missing_requirement() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("image templates need root (namespaces, mounts, whiteouts)".into());
    }
    if let Some(reason) = space_testkit::jail::missing_requirement() {
        return Some(reason);
    }
    let busybox_static = space_worker::substrate::jail::template::is_static(Path::new(BUSYBOX));
    if !busybox_static {
        return Some(format!(
            "needs a statically linked busybox at {BUSYBOX} (Debian: busybox-static) as the test image's userland"
        ));
    }
    None
}

/// A driver on a private data dir and a private cgroup parent.
struct Env {
    driver: Arc<JailDriver>,
    data: tempfile::TempDir,
    layers: tempfile::TempDir,
}

impl Env {
    fn new() -> Self {
        let mut config = JailConfig::new(space_testkit::workspace_bin("space-jail", "space-jail"));
        config.cgroup_parent = format!("space-test-image-{}", std::process::id());
        Self {
            driver: Arc::new(JailDriver::new(config).unwrap()),
            data: tempfile::tempdir().unwrap(),
            layers: tempfile::tempdir().unwrap(),
        }
    }

    fn launch(&self, agent: PathBuf, template: &TemplateSpec) -> Result<Running<'_>, LaunchError> {
        let bins = Binaries {
            agent,
            bridge: space_testkit::workspace_bin("spaced-host", "spaced-host"),
        };
        let activation = Activation {
            sandbox: SandboxId::from_bytes(random()),
            generation: Generation(1),
            execution_id: ExecutionId::from_bytes(random()),
            activation: 1,
            secret: random(),
        };
        let (handle, bridge) = launch::launch(
            &*self.driver,
            &bins,
            self.data.path(),
            &activation,
            Limits::default(),
            template,
        )?;
        Ok(Running {
            env: self,
            handle,
            bridge,
            activation,
        })
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let parent = &self.driver.config().cgroup_parent;
        for dir in self.driver.hierarchy().parent_dirs(parent) {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

struct Running<'a> {
    env: &'a Env,
    handle: SandboxHandle,
    bridge: BridgeRecord,
    activation: Activation,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        launch::teardown(
            &*self.env.driver,
            self.env.data.path(),
            Some(&self.handle),
            Some(&self.bridge),
            Layer::Discard,
        );
    }
}

impl Running<'_> {
    fn connect(&self) -> AgentConnection {
        spaced_host::connect(&launch::bridge_target(&self.bridge, &self.activation)).unwrap()
    }

    fn sh(&self, script: &str) -> (i32, String) {
        let out = self.connect().exec(ExecSpec::shell(script)).unwrap();
        let code = match out.status.outcome {
            ExitOutcome::Code(c) => c,
            other => panic!("{script}: {other:?}"),
        };
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        (code, text)
    }
}

fn write(path: &Path, content: &str, mode: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The overlay's whiteout for `name`: a character device 0/0.
fn whiteout(path: &Path) {
    nix::sys::stat::mknod(
        path,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::empty(),
        0,
    )
    .unwrap();
}

fn opaque(dir: &Path) {
    let path = CString::new(dir.as_os_str().as_bytes()).unwrap();
    let name = CString::new("trusted.overlay.opaque").unwrap();
    // SAFETY: both strings are NUL-terminated and the value is one valid byte.
    #[allow(unsafe_code)]
    let done = unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), b"y".as_ptr().cast(), 1, 0) };
    assert_eq!(done, 0, "setxattr: {}", std::io::Error::last_os_error());
}

/// Two layers: a base with busybox, accounts, an `/etc/os-release`, a file and a
/// directory the top layer hides (a whiteout, an opaque directory); the top layer
/// also changes `/etc/os-release`. Returns the lower dirs, top first.
fn image(root: &Path) -> Vec<PathBuf> {
    let base = root.join("base");
    let top = root.join("top");
    std::fs::create_dir_all(base.join("bin")).unwrap();
    std::fs::copy(BUSYBOX, base.join("bin/busybox")).unwrap();
    for tool in ["sh", "cat", "ls", "id", "stat", "test", "echo"] {
        symlink("busybox", base.join("bin").join(tool)).unwrap();
    }
    write(
        &base.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\napp:x:1234:1234:app:/home/app:/bin/sh\n",
        0o644,
    );
    write(&base.join("etc/group"), "root:x:0:\napp:x:1234:\n", 0o644);
    write(
        &base.join("etc/os-release"),
        "ID=spacetest\nVERSION_ID=1\n",
        0o644,
    );
    write(&base.join("doomed"), "lower\n", 0o644);
    write(&base.join("dir/old"), "old\n", 0o644);
    write(&base.join("home/app/owned"), "app's\n", 0o600);
    std::os::unix::fs::chown(base.join("home/app/owned"), Some(1234), Some(1234)).unwrap();

    write(
        &top.join("etc/os-release"),
        "ID=spacetest\nVERSION_ID=2\n",
        0o644,
    );
    whiteout(&top.join("doomed"));
    std::fs::create_dir_all(top.join("dir")).unwrap();
    opaque(&top.join("dir"));
    write(&top.join("dir/new"), "new\n", 0o644);
    vec![top, base]
}

#[test]
fn a_sandbox_on_an_image_sees_its_stacked_layers_and_nothing_of_the_hosts_system() {
    if let Some(reason) = missing_requirement() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let env = Env::new();
    let template = TemplateSpec::Image {
        digest: "sha256:test".into(),
        lower_dirs: image(env.layers.path()),
    };
    let r = env
        .launch(space_testkit::static_agent(), &template)
        .unwrap();
    // The top layer's file wins; the whiteout hides the base's file; the opaque
    // directory hides the base's entries of it.
    let (code, out) = r.sh("cat /etc/os-release; test -e /doomed || echo gone; ls /dir");
    assert_eq!(code, 0, "{out}");
    assert_eq!(out, "ID=spacetest\nVERSION_ID=2\ngone\nnew\n");
    // The image's accounts are kept, its owners are the sandbox's ids; the platform
    // still writes the hostname and the resolver.
    let (code, out) = r.sh(
        "cat /etc/passwd; stat -c '%u:%g %a' /home/app/owned; cat /etc/hostname /etc/resolv.conf",
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("root:x:0:0:root:/root:/bin/sh\napp:x:1234:1234:"),
        "{out}"
    );
    assert!(
        !out.contains("user:x:1000"),
        "synthesized accounts replaced the image's: {out}"
    );
    assert!(out.contains("1234:1234 600\n"), "{out}");
    assert!(out.contains("nameserver "), "{out}");
    // Nothing of the host: no `/usr` (the image has none), no host program.
    let (code, out) = r.sh("ls /usr 2>&1; test -e /usr/bin/python3 || echo no-python");
    assert_ne!(out.find("no-python"), None, "{out} (exit {code})");
    // What the sandbox writes lands in its own layer, never in the template's.
    let (code, out) = r.sh("echo mine > /etc/os-release && cat /etc/os-release");
    assert_eq!((code, out.as_str()), (0, "mine\n"));
    assert_eq!(
        std::fs::read_to_string(env.layers.path().join("top/etc/os-release")).unwrap(),
        "ID=spacetest\nVERSION_ID=2\n"
    );
    assert_eq!(
        std::fs::read_to_string(r.handle.upper_dir.join("etc/os-release")).unwrap(),
        "mine\n"
    );
}

#[test]
fn an_image_template_with_a_dynamically_linked_agent_is_refused_with_the_reason() {
    if let Some(reason) = missing_requirement() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let env = Env::new();
    let template = TemplateSpec::Image {
        digest: "sha256:test".into(),
        lower_dirs: image(env.layers.path()),
    };
    let dynamic = space_testkit::workspace_bin("spaced-guest", "spaced-guest");
    match env.launch(dynamic, &template) {
        Err(LaunchError::Substrate(SubstrateError::InvalidSpec(why))) => {
            assert!(why.contains("statically linked agent"), "{why}");
        }
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("launched an image template with a dynamically linked agent"),
    }
}
