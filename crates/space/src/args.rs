//! The command line of `space`: every subcommand and its arguments, parsed by clap.
//! Each daemon and command module takes its arguments from here.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::bench::cmd::BenchCmd;

/// SPACE: sandboxes for AI agents, where every request reaches the execution it was
/// authorized for.
#[derive(Debug, Parser)]
#[command(name = "space", version, about)]
pub struct Cli {
    /// Edge URL.
    #[arg(
        long,
        global = true,
        env = "SPACE_URL",
        default_value = "http://127.0.0.1:7070"
    )]
    pub url: String,
    /// API key (default: ./.space/admin.key when present).
    #[arg(long, global = true, env = "SPACE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// Commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the platform on this machine: control plane + edge, N workers, SQLite.
    Up(UpArgs),
    /// Run the control plane (with its edge).
    Control(ControlArgs),
    /// Run a worker.
    Worker(WorkerArgs),
    /// Run an edge in front of a control plane.
    Edge(EdgeArgs),
    /// Manage sandboxes.
    #[command(subcommand)]
    Sandbox(SandboxCmd),
    /// Run a command in a sandbox; exits with the command's exit code.
    Exec(ExecArgs),
    /// Files in a sandbox.
    #[command(subcommand)]
    Fs(FsCmd),
    /// An interactive shell in a sandbox (a PTY over WebSocket).
    Term {
        /// Sandbox ID.
        sandbox: String,
        /// Run the shell as this account of the sandbox (a user name or a uid), in
        /// its home; root by default.
        #[arg(long, short = 'u')]
        user: Option<String>,
    },
    /// Print changes under a directory of a sandbox, one JSON line each.
    Watch {
        /// Sandbox ID.
        sandbox: String,
        /// Directory in the sandbox.
        #[arg(default_value = "/root")]
        path: String,
        /// Also watch subdirectories.
        #[arg(long)]
        recursive: bool,
    },
    /// Service ports of a sandbox: expose one (HTTP or TCP) at a URL through the
    /// edge, list, close, browser links, a local TCP forward.
    #[command(subcommand)]
    Port(PortCmd),
    /// Templates: images imported once (admin), listed, removed.
    #[command(subcommand)]
    Template(TemplateCmd),
    /// List workers.
    Workers,
    /// Signing keys.
    #[command(subcommand)]
    Keys(KeysCmd),
    /// Benchmarks and the churn soak, against a `space up` started for them.
    #[command(subcommand)]
    Bench(BenchCmd),
    /// VM sandboxes: prepare what they boot (on this machine, no server needed).
    #[command(subcommand)]
    Vm(VmCmd),
}

/// `space vm …`.
#[derive(Debug, Subcommand)]
pub enum VmCmd {
    /// Prepare the guest kernel in the data directory: Debian's
    /// `linux-image-cloud-amd64` kernel (fetched with apt-get download, or the given
    /// package file) unpacked without installing it, with the modules a guest loads.
    Setup {
        /// Data directory (the one `space up` uses).
        #[arg(long, default_value = ".space")]
        data_dir: PathBuf,
        /// A kernel package file (`linux-image-*.deb`) instead of downloading one.
        #[arg(long)]
        kernel_deb: Option<PathBuf>,
    },
}

/// `space up`.
#[derive(Debug, Args)]
pub struct UpArgs {
    /// Data directory.
    #[arg(long, default_value = ".space")]
    pub data_dir: PathBuf,
    /// Control plane + edge address.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: std::net::SocketAddr,
    /// Number of worker processes.
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
    /// Jails each worker keeps launched ahead of demand (0 turns the pool off).
    #[arg(long, env = "SPACE_WARM_POOL", default_value_t = space_worker::daemon::DEFAULT_WARM_POOL)]
    pub warm_pool: usize,
    /// Sandboxes kept running, unowned, for creates to claim: a create without its own
    /// environment or worker then costs one write (0 turns it off) [default: 16 per
    /// worker].
    #[arg(long, env = "SPACE_STANDBY")]
    pub standby: Option<usize>,
    /// Standby sandboxes with their network link made, for creates in mode `egress`
    /// (of the default template; their policy is the create's, set at the claim): a
    /// link is the one step of such a create the kernel serialises, so a burst of them
    /// needs these to stay fast. 0 turns it off; needs egress on the workers.
    #[arg(long, env = "SPACE_STANDBY_EGRESS", default_value_t = 0)]
    pub standby_egress: usize,
    /// Workers run jails as host uid 0 without user namespaces (weaker; see
    /// `space worker --no-userns`).
    #[arg(long, env = "SPACE_NO_USERNS")]
    pub no_userns: bool,
    /// Domain of service-port URLs, `{port}-{sandbox}.{domain}` (`localhost` works in
    /// a browser without DNS; elsewhere a wildcard DNS name pointing at the edge).
    #[arg(long, env = "SPACE_DOMAIN", default_value = "localhost")]
    pub domain: String,
    /// Network mode of a sandbox created without a policy: `none` (loopback only) or
    /// `egress` (outbound connections under the global deny list; a create's
    /// `network`, or `space sandbox create --net`, chooses otherwise).
    #[arg(long, env = "SPACE_NETWORK_DEFAULT", default_value = "none", value_parser = network_mode())]
    pub network_default: space_proto::api::NetworkMode,
    /// The template of a sandbox created without one: `debian` (Debian bookworm with
    /// Python 3, built with mmdebstrap on the first start — progress shown — and kept
    /// as the template `debian-default`; until then, and where it cannot be built,
    /// the host's directories, saying why) or `host` (the host's system directories,
    /// read-only, always).
    #[arg(long, env = "SPACE_DEFAULT_TEMPLATE", default_value = "debian", value_parser = ["host", "debian"])]
    pub default_template: String,
    /// Standby sandboxes of an image template as well, `NAME[:TAG]=N` (repeatable):
    /// N in all, spread over the workers, for creates of that template to claim
    /// (kept once the template is imported).
    #[arg(long = "standby-template", env = "SPACE_STANDBY_TEMPLATES", value_delimiter = ',', value_parser = standby_template())]
    pub standby_templates: Vec<space_control::service::TemplatePool>,
    /// How many of the workers run VM sandboxes (`space worker --substrate vm`; the
    /// last ones: w2 of two with 1). Sandboxes ask for one with `--substrate vm`; with
    /// every worker a VM worker, that is the default.
    #[arg(long, env = "SPACE_VM_WORKERS", default_value_t = 0)]
    pub vm_workers: u32,
    /// VM workers: the guest kernel [default: `<data-dir>/vm/kernel`, made by
    /// `space vm setup --data-dir <data-dir>`].
    #[arg(long, env = "SPACE_VM_KERNEL_DIR")]
    pub vm_kernel_dir: Option<PathBuf>,
    /// Sandbox egress.
    #[command(flatten)]
    pub egress: EgressArgs,
}

impl UpArgs {
    /// Standby sandboxes to keep: as asked, or 16 per worker — none by default where
    /// every worker runs VMs (the default template, the host's directories, cannot be
    /// a VM's root).
    pub fn standby(&self) -> usize {
        let per_worker = match self.vm_workers == self.workers {
            true => 0,
            false => space_control::service::STANDBY_PER_WORKER,
        };
        self.standby.unwrap_or(per_worker * self.workers as usize)
    }
}

/// `space control`.
#[derive(Debug, Args)]
pub struct ControlArgs {
    /// Listen address.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: std::net::SocketAddr,
    /// Data directory.
    #[arg(long, default_value = ".space")]
    pub data_dir: PathBuf,
    /// PostgreSQL URL (`postgres://…`); SQLite in the data directory otherwise.
    #[arg(long, env = "SPACE_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Sandboxes kept running, unowned, for creates to claim (0 turns it off).
    #[arg(long, env = "SPACE_STANDBY", default_value_t = 0)]
    pub standby: usize,
    /// Standby sandboxes with their network link made, for creates in mode `egress`
    /// (of the default template; their policy is the create's, set at the claim): a
    /// link is the one step of such a create the kernel serialises, so a burst of them
    /// needs these to stay fast. 0 turns it off; needs egress on the workers.
    #[arg(long, env = "SPACE_STANDBY_EGRESS", default_value_t = 0)]
    pub standby_egress: usize,
    /// Domain of service-port URLs, `{port}-{sandbox}.{domain}`.
    #[arg(long, env = "SPACE_DOMAIN", default_value = "localhost")]
    pub domain: String,
    /// Network mode of a sandbox created without a policy: `none` (loopback only) or
    /// `egress` (outbound connections under the global deny list; a create's
    /// `network`, or `space sandbox create --net`, chooses otherwise).
    #[arg(long, env = "SPACE_NETWORK_DEFAULT", default_value = "none", value_parser = network_mode())]
    pub network_default: space_proto::api::NetworkMode,
    /// The template of a sandbox created without one: `default` (the host's system
    /// directories) or an imported template's `name[:tag]`.
    #[arg(long, default_value = space_control::service::DEFAULT_TEMPLATE)]
    pub default_template: String,
    /// Standby sandboxes of an image template as well, `NAME[:TAG]=N` (repeatable):
    /// N in all, spread over the workers, for creates of that template to claim
    /// (kept once the template is imported).
    #[arg(long = "standby-template", env = "SPACE_STANDBY_TEMPLATES", value_delimiter = ',', value_parser = standby_template())]
    pub standby_templates: Vec<space_control::service::TemplatePool>,
    /// The substrate of a sandbox created without one (`jail` or `vm`).
    #[arg(long, env = "SPACE_DEFAULT_SUBSTRATE", default_value = "jail", value_parser = substrate_name())]
    pub default_substrate: space_identity::Substrate,
}

fn standby_template()
-> impl clap::builder::TypedValueParser<Value = space_control::service::TemplatePool> {
    |s: &str| space_control::service::TemplatePool::parse(s)
}

/// `space worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Worker ID (a DNS label).
    #[arg(long)]
    pub id: String,
    /// Control-plane URL.
    #[arg(long)]
    pub control: String,
    /// File holding the enrollment secret.
    #[arg(long, conflicts_with = "enroll_secret")]
    pub enroll_secret_file: Option<PathBuf>,
    /// The enrollment secret.
    #[arg(long, env = "SPACE_ENROLL_SECRET", hide_env_values = true)]
    pub enroll_secret: Option<String>,
    /// node-api listen address.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: std::net::SocketAddr,
    /// URL others reach node-api at.
    #[arg(long)]
    pub advertise_url: Option<String>,
    /// Data directory.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Most sandboxes.
    #[arg(long, default_value_t = 1000)]
    pub capacity: u32,
    /// cgroup parent directory name (distinct per worker on one host).
    #[arg(long)]
    pub cgroup_parent: Option<String>,
    /// Jails kept launched ahead of demand, so that a create costs an activation
    /// rather than a launch (0 turns the pool off; needs root).
    #[arg(long, env = "SPACE_WARM_POOL", default_value_t = space_worker::daemon::DEFAULT_WARM_POOL)]
    pub warm_pool: usize,
    /// Run jails as host uid 0 without a user namespace of their own. Weaker: every
    /// sandbox then shares host root's per-user kernel limits (see
    /// docs/operations.md); only for kernels without idmapped mounts.
    #[arg(long, env = "SPACE_NO_USERNS")]
    pub no_userns: bool,
    /// First host uid of the jails' user namespace ranges (65,536 ids per sandbox;
    /// every worker of a host draws from the same ranges).
    #[arg(long, default_value_t = space_worker::substrate::jail::uid_ranges::DEFAULT_FIRST_ID)]
    pub userns_first_uid: u32,
    /// How many such ranges (sandboxes with a user namespace at once, on this host).
    #[arg(long, default_value_t = space_worker::substrate::jail::uid_ranges::DEFAULT_SLOTS)]
    pub userns_ranges: u32,
    /// Sandbox egress.
    #[command(flatten)]
    pub egress: EgressArgs,
    /// Directory holding spaced-guest, spaced-host and space-jail (default: next to
    /// this executable).
    #[arg(long, env = "SPACE_BIN_DIR")]
    pub bin_dir: Option<PathBuf>,
    /// The guest agent (default: `spaced-guest` of the bin dir, or where that one is
    /// dynamically linked, the static build of `cargo static-agent` beside it, which
    /// image templates need).
    #[arg(long, env = "SPACE_AGENT")]
    pub agent: Option<PathBuf>,
    /// What runs this worker's sandboxes: `jail` (namespaces on this kernel) or `vm`
    /// (each in a QEMU virtual machine with its own kernel; see `space vm setup`).
    #[arg(long, env = "SPACE_SUBSTRATE", default_value = "jail", value_parser = substrate_name())]
    pub substrate: space_identity::Substrate,
    /// VM workers: QEMU.
    #[arg(
        long,
        env = "SPACE_QEMU",
        default_value = "/usr/bin/qemu-system-x86_64"
    )]
    pub qemu: PathBuf,
    /// VM workers: the VMM, `qemu` (software emulation where KVM does not boot a
    /// stock kernel) or `firecracker` (KVM only; `--firecracker`).
    #[arg(long, env = "SPACE_VMM", default_value = "qemu", value_parser = ["qemu", "firecracker"])]
    pub vmm: String,
    /// VM workers under QEMU: how a VM's agent is reached — `auto` and `serial` (the
    /// virtio-serial port; vhost-vsock is not taken unasked, see the threat model's
    /// known limits) or `vsock` (vhost-vsock where `/dev/vhost-vsock` opens read-write
    /// and a reserved vsock port binds, or the worker does not start). The choice and
    /// its reason are logged at start.
    #[arg(long, env = "SPACE_VM_TRANSPORT", default_value = "auto", value_parser = ["auto", "serial", "vsock"])]
    pub vm_transport: String,
    /// VM workers with `--vmm firecracker`: the `firecracker` binary.
    #[arg(
        long,
        env = "SPACE_FIRECRACKER",
        default_value = "/usr/local/bin/firecracker"
    )]
    pub firecracker: PathBuf,
    /// VM workers: the guest kernel `space vm setup` prepared [default:
    /// `<data-dir>/vm/kernel`].
    #[arg(long, env = "SPACE_VM_KERNEL_DIR")]
    pub vm_kernel_dir: Option<PathBuf>,
}

/// The egress flags of `space worker` and `space up`.
#[derive(Debug, Clone, Args)]
pub struct EgressArgs {
    /// No egress: sandboxes in network mode `egress` are refused (by this worker, or by
    /// every worker of `space up`).
    #[arg(long, env = "SPACE_NO_EGRESS", action = clap::ArgAction::SetTrue, value_parser = clap::builder::BoolishValueParser::new())]
    pub no_egress: bool,
    /// Egress slot: which `/12` of `240.0.0.0/4` sandbox links take their addresses
    /// from, and the names of the links and the nftables table (workers sharing a
    /// host take different slots; `space up` numbers its workers from this one).
    #[arg(long, env = "SPACE_EGRESS_SLOT", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=254))]
    pub egress_slot: u8,
    /// A network no sandbox reaches whatever its policy, on top of the defaults
    /// (repeatable, or comma-separated in the variable).
    #[arg(long, env = "SPACE_EGRESS_DENY", value_delimiter = ',')]
    pub egress_deny: Vec<space_egress::IpNet>,
    /// A private range (RFC 1918, ULA, shared address space) sandboxes may reach;
    /// refused by default (repeatable).
    #[arg(long, env = "SPACE_EGRESS_ALLOW_PRIVATE", value_delimiter = ',')]
    pub egress_allow_private: Vec<space_egress::IpNet>,
    /// DNS server the platform's resolver asks for sandboxes, `ADDR` or `ADDR:PORT`
    /// (repeatable) [default: the host's /etc/resolv.conf].
    #[arg(long, env = "SPACE_EGRESS_DNS", value_delimiter = ',', value_parser = parse_dns_server)]
    pub egress_dns: Vec<std::net::SocketAddr>,
}

/// `space edge`.
#[derive(Debug, Args)]
pub struct EdgeArgs {
    /// Control-plane URL.
    #[arg(long)]
    pub control: String,
    /// Listen address.
    #[arg(long, default_value = "127.0.0.1:7071")]
    pub listen: std::net::SocketAddr,
}

/// `space sandbox …`.
#[derive(Debug, Subcommand)]
pub enum SandboxCmd {
    /// Create a sandbox.
    Create {
        /// Lifetime in seconds.
        #[arg(long)]
        ttl: Option<u64>,
        /// At the TTL: stop (default) or pause.
        #[arg(long, value_parser = ["stop", "pause"])]
        ttl_action: Option<String>,
        /// Environment variable (repeatable).
        #[arg(long = "env", value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// Place on this worker.
        #[arg(long)]
        worker: Option<String>,
        /// Metadata (a JSON object).
        #[arg(long)]
        metadata: Option<String>,
        /// Memory limit in MiB (RAM and swap together).
        #[arg(long)]
        memory_mib: Option<u64>,
        /// CPU limit in cores (`0.5`, `2`).
        #[arg(long)]
        cpus: Option<f64>,
        /// Most processes and threads at once.
        #[arg(long)]
        pids: Option<u32>,
        /// Disk limit in MiB for the sandbox's files.
        #[arg(long)]
        disk_mib: Option<u64>,
        /// Network (`--net`, `--allow`, `--deny`).
        #[command(flatten)]
        network: NetworkFlags,
        /// Template, `NAME[:TAG]` (`space template ls`); the host-directories
        /// `default` when absent.
        #[arg(long)]
        template: Option<String>,
        /// What runs it: `jail` or `vm` (its own kernel; needs an image template and
        /// a worker started with `--substrate vm`) [default: the platform's].
        #[arg(long, value_parser = substrate_name())]
        substrate: Option<space_identity::Substrate>,
    },
    /// Show a sandbox's network policy, or replace it with `--net` (and `--allow`,
    /// `--deny`): new connections of its running execution follow the new policy, and
    /// so does every later execution.
    Network {
        /// Sandbox ID.
        id: String,
        /// The new policy; without `--net` the policy is shown.
        #[command(flatten)]
        network: NetworkFlags,
    },
    /// What the platform refused the sandbox lately (network policy refusals of its
    /// current execution: DNS questions, HTTP and TLS connections), newest first.
    Events {
        /// Sandbox ID.
        id: String,
    },
    /// List sandboxes.
    List,
    /// Show one sandbox.
    Get {
        /// Sandbox ID.
        id: String,
    },
    /// Remove a sandbox.
    Rm {
        /// Sandbox ID.
        id: String,
    },
    /// Pause a sandbox in place (same execution).
    Pause {
        /// Sandbox ID.
        id: String,
    },
    /// Resume a paused sandbox: in place, or from its snapshot on `--worker` (a new
    /// execution).
    Resume {
        /// Sandbox ID.
        id: String,
        /// Restore the snapshot on this worker.
        #[arg(long)]
        worker: Option<String>,
    },
    /// Freeze a sandbox and keep its writable layer (it is then paused).
    Snapshot {
        /// Sandbox ID.
        id: String,
    },
    /// Move a sandbox to another worker (a new execution, with its files).
    Migrate {
        /// Sandbox ID.
        id: String,
        /// Target worker.
        #[arg(long)]
        worker: String,
    },
}

/// `space exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Sandbox ID.
    pub sandbox: String,
    /// Kill after this many seconds.
    #[arg(long)]
    pub timeout: Option<u64>,
    /// Working directory (default: the account's home).
    #[arg(long)]
    pub cwd: Option<String>,
    /// Run as this account of the sandbox (a user name or a uid): its uid, groups,
    /// HOME, USER, LOGNAME and SHELL; root by default.
    #[arg(long, short = 'u')]
    pub user: Option<String>,
    /// Environment variable (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Print output as it is produced (a WebSocket stream) instead of at the end;
    /// stdin is forwarded as it is read (any size; its end closes the command's).
    #[arg(long)]
    pub stream: bool,
    /// Do not read stdin (by default, stdin that is not a terminal is sent to the
    /// command: up to 64 MiB, any size with --stream).
    #[arg(long, short = 'n')]
    pub no_stdin: bool,
    /// Keep at most this many bytes of each of stdout and stderr (default 16 MiB, at
    /// most 32 MiB; ignored with --stream, which has no cap).
    #[arg(long, value_name = "BYTES")]
    pub max_output_bytes: Option<u64>,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    pub cmd: Vec<String>,
}

/// `space fs …`.
#[derive(Debug, Subcommand)]
pub enum FsCmd {
    /// Download a file (to stdout with `-` or no LOCAL), or with `-r` a directory.
    Get {
        /// Sandbox ID.
        sandbox: String,
        /// Path in the sandbox.
        path: String,
        /// Local file (with `-r`: the local directory, made if missing).
        local: Option<PathBuf>,
        /// PATH is a directory: download it whole (a tar stream unpacked into LOCAL,
        /// never outside it; setuid bits and devices are not kept).
        #[arg(long, short = 'r')]
        recursive: bool,
    },
    /// Upload a file (from stdin with `-`), keeping its mode; or with `-r` a
    /// directory. Missing parent directories in the sandbox are made.
    Put {
        /// Sandbox ID.
        sandbox: String,
        /// Local file or `-` (with `-r`: a local directory).
        local: PathBuf,
        /// Path in the sandbox (with `-r`: the directory to unpack into).
        path: String,
        /// LOCAL is a directory: upload it whole (files, directories, symlinks as
        /// links, modes, mtimes).
        #[arg(long, short = 'r')]
        recursive: bool,
        /// Permission bits of the file in octal (default: the local file's mode; for
        /// stdin, 0644 for a new file, an existing one keeps its mode).
        #[arg(long, value_parser = octal_mode)]
        mode: Option<u32>,
        /// Write as this account of the sandbox (a user name or a uid): the file and
        /// the directories made for it are its own.
        #[arg(long, short = 'u')]
        user: Option<String>,
    },
    /// List a directory.
    Ls {
        /// Sandbox ID.
        sandbox: String,
        /// Directory in the sandbox.
        #[arg(default_value = "/")]
        path: String,
    },
    /// Remove a file or directory.
    Rm {
        /// Sandbox ID.
        sandbox: String,
        /// Path in the sandbox.
        path: String,
    },
}

/// `space template …`.
#[derive(Debug, Subcommand)]
pub enum TemplateCmd {
    /// Import an image as a template (admin key): an OCI image layout (a directory,
    /// or a tar of one) or a `docker save` / `podman save` archive.
    Import {
        /// `NAME[:TAG]` (`latest` when no tag is given).
        name: String,
        /// The archive or OCI layout directory.
        path: PathBuf,
    },
    /// Pull an image from a registry and import it as a template (admin key). The
    /// pull runs here, with your credentials; the platform only receives the image.
    Pull(crate::cli::pull::PullArgs),
    /// List the templates.
    Ls,
    /// Remove a template (admin key); refused while sandboxes use it.
    Rm {
        /// `NAME[:TAG]`.
        name: String,
    },
    /// Build a Debian template with mmdebstrap (admin key), then run each `--run`
    /// step in a sandbox of it and commit its changes as one more layer.
    Build(crate::cli::build::BuildArgs),
}

/// `space port …`.
#[derive(Debug, Subcommand)]
pub enum PortCmd {
    /// Expose a port of a sandbox (a server listening on its loopback) through the
    /// edge; prints its URL, then its access token and a one-time browser link.
    /// Exposing it again replaces it (and its token).
    Expose {
        /// Sandbox ID.
        id: String,
        /// The port inside the sandbox.
        #[arg(value_parser = port_number)]
        port: u16,
        /// A raw TCP port (reach it with `space port forward`) rather than HTTP.
        #[arg(long)]
        tcp: bool,
        /// Anyone with the URL may connect (default: only the API key or the port's
        /// token).
        #[arg(long)]
        public: bool,
    },
    /// List the exposed ports of a sandbox.
    Ls {
        /// Sandbox ID.
        id: String,
    },
    /// Close an exposed port.
    Rm {
        /// Sandbox ID.
        id: String,
        /// The port inside the sandbox.
        #[arg(value_parser = port_number)]
        port: u16,
    },
    /// Print a new one-time browser link to an exposed port (it sets the port's token
    /// as a cookie and redirects to its URL).
    Link {
        /// Sandbox ID.
        id: String,
        /// The port inside the sandbox.
        #[arg(value_parser = port_number)]
        port: u16,
    },
    /// Forward a local TCP address to an exposed port, through the edge, until
    /// Ctrl-C (each local connection is a tunnel of its own; at most 256 at once).
    Forward {
        /// Sandbox ID.
        id: String,
        /// The port inside the sandbox.
        #[arg(value_parser = port_number)]
        port: u16,
        /// Local address to listen on (port 0: any free port; the first line printed
        /// names the one taken).
        #[arg(long, default_value = "127.0.0.1:0")]
        local: std::net::SocketAddr,
    },
}

/// `none` or `egress`.
/// `--net`, `--allow`, `--deny` of `space sandbox create` and `space sandbox network`.
#[derive(Debug, Clone, Args)]
pub struct NetworkFlags {
    /// Network: `none` (loopback only, the platform's default unless its operator
    /// chose otherwise) or `egress` (outbound connections under `--allow` and
    /// `--deny`).
    #[arg(long, value_parser = network_mode())]
    pub net: Option<space_proto::api::NetworkMode>,
    /// With `--net egress`: a name (`pypi.org`), a wildcard (`*.example.com`) or an
    /// address or network (`203.0.113.0/24`) it may reach (repeatable; none:
    /// everything not denied).
    #[arg(long = "allow", value_name = "RULE")]
    pub allow: Vec<String>,
    /// With `--net egress`: a name, wildcard, address or network it may not reach,
    /// whatever `--allow` says (repeatable).
    #[arg(long = "deny", value_name = "RULE")]
    pub deny: Vec<String>,
}

/// `jail` or `vm`: the substrates a worker can run.
fn substrate_name() -> impl clap::builder::TypedValueParser<Value = space_identity::Substrate> {
    use clap::builder::TypedValueParser as _;
    use space_identity::Substrate;
    clap::builder::PossibleValuesParser::new(["jail", "vm"]).map(|s| match s.as_str() {
        "vm" => Substrate::Vm,
        _ => Substrate::Jail,
    })
}

fn network_mode() -> impl clap::builder::TypedValueParser<Value = space_proto::api::NetworkMode> {
    use clap::builder::TypedValueParser as _;
    use space_proto::api::NetworkMode;
    clap::builder::PossibleValuesParser::new(["none", "egress"]).map(|s| match s.as_str() {
        "egress" => NetworkMode::Egress,
        _ => NetworkMode::None,
    })
}

/// A port inside a sandbox: 1–65535.
fn port_number(s: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("{s:?} is not a port (1-65535)")),
        Ok(p) => Ok(p),
    }
}

/// `space keys …`.
#[derive(Debug, Subcommand)]
pub enum KeysCmd {
    /// Publish a new signing key to every receiver, then sign with it.
    Rotate,
    /// A new API key of your tenant (printed once): `space_…`, or `e2b_…` with `--e2b`.
    Create {
        /// In E2B's format, for E2B's SDKs (`E2B_API_KEY`).
        #[arg(long)]
        e2b: bool,
    },
}

/// A DNS server: an address, with port 53 unless one is given.
fn parse_dns_server(text: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(a) = text.parse::<std::net::SocketAddr>() {
        return Ok(a);
    }
    text.parse::<std::net::IpAddr>()
        .map(|ip| std::net::SocketAddr::new(ip, 53))
        .map_err(|_| format!("{text:?} is not an address or address:port"))
}

/// An octal file mode, at most `7777`.
fn octal_mode(text: &str) -> Result<u32, String> {
    match u32::from_str_radix(text, 8) {
        Ok(m) if m <= 0o7777 => Ok(m),
        _ => Err(format!("{text:?} is not an octal mode from 0 to 7777")),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `space up ARGS…` parsed.
    pub(crate) fn up(args: &[&str]) -> UpArgs {
        let argv = ["space", "up"].iter().chain(args).copied();
        match Cli::try_parse_from(argv).expect("parses").command {
            Command::Up(a) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn egress_flags_of_up_take_lists_and_a_dns_server_without_a_port_takes_53() {
        let a = up(&[
            "--egress-slot",
            "7",
            "--egress-deny",
            "203.0.113.0/24",
            "--egress-deny",
            "198.51.100.7",
            "--egress-allow-private",
            "10.1.0.0/16",
            "--egress-dns",
            "127.0.0.53",
            "--egress-dns",
            "127.0.0.1:5353",
        ]);
        let a = a.egress;
        assert!(!a.no_egress);
        assert_eq!(a.egress_slot, 7);
        assert_eq!(a.egress_deny.len(), 2);
        assert_eq!(a.egress_allow_private.len(), 1);
        assert_eq!(
            a.egress_dns,
            [
                "127.0.0.53:53".parse::<std::net::SocketAddr>().unwrap(),
                "127.0.0.1:5353".parse().unwrap()
            ]
        );
        assert!(up(&["--no-egress"]).egress.no_egress);
        let bad = ["space", "up", "--egress-dns", "resolver.example"];
        assert!(Cli::try_parse_from(bad).is_err());
        let bad = ["space", "up", "--egress-deny", "300.1.2.3/8"];
        assert!(Cli::try_parse_from(bad).is_err());
    }

    fn port(args: &[&str]) -> Result<PortCmd, clap::Error> {
        let argv = ["space", "port"].iter().chain(args).copied();
        Cli::try_parse_from(argv).map(|c| match c.command {
            Command::Port(p) => p,
            other => panic!("{other:?}"),
        })
    }

    #[test]
    fn port_expose_is_http_and_private_unless_told_otherwise() {
        match port(&["expose", "sbx_x", "8000"]).expect("parses") {
            PortCmd::Expose {
                id,
                port,
                tcp,
                public,
            } => assert_eq!(
                (id.as_str(), port, tcp, public),
                ("sbx_x", 8000, false, false)
            ),
            other => panic!("{other:?}"),
        }
        match port(&["expose", "sbx_x", "5432", "--tcp", "--public"]).expect("parses") {
            PortCmd::Expose { tcp, public, .. } => assert!(tcp && public),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_port_outside_1_to_65535_is_refused_by_every_port_command() {
        for bad in ["0", "65536", "99999999", "http"] {
            for cmd in ["expose", "rm", "link", "forward"] {
                let e = port(&[cmd, "sbx_x", bad]).expect_err(bad);
                assert_eq!(
                    e.kind(),
                    clap::error::ErrorKind::ValueValidation,
                    "{cmd} {bad}"
                );
            }
        }
        // A leading dash reads as a flag: refused too.
        assert!(port(&["expose", "sbx_x", "-1"]).is_err());
        assert!(port(&["expose", "sbx_x", "65535"]).is_ok());
        assert!(port(&["expose", "sbx_x", "1"]).is_ok());
    }

    #[test]
    fn port_forward_listens_on_a_free_loopback_port_unless_given_an_address() {
        match port(&["forward", "sbx_x", "6379"]).expect("parses") {
            PortCmd::Forward { local, port, .. } => {
                assert_eq!((local.to_string().as_str(), port), ("127.0.0.1:0", 6379));
            }
            other => panic!("{other:?}"),
        }
        match port(&["forward", "sbx_x", "6379", "--local", "127.0.0.1:16379"]).expect("parses") {
            PortCmd::Forward { local, .. } => assert_eq!(local.to_string(), "127.0.0.1:16379"),
            other => panic!("{other:?}"),
        }
        assert!(port(&["forward", "sbx_x", "6379", "--local", "localhost"]).is_err());
    }

    #[test]
    fn port_ls_rm_and_link_take_their_arguments_and_nothing_more() {
        assert!(matches!(port(&["ls", "sbx_x"]), Ok(PortCmd::Ls { id }) if id == "sbx_x"));
        assert!(matches!(
            port(&["rm", "sbx_x", "80"]),
            Ok(PortCmd::Rm { port: 80, .. })
        ));
        assert!(matches!(
            port(&["link", "sbx_x", "80"]),
            Ok(PortCmd::Link { port: 80, .. })
        ));
        assert!(port(&["rm", "sbx_x"]).is_err());
        assert!(port(&["ls", "sbx_x", "80"]).is_err());
        assert!(port(&["link", "sbx_x", "80", "--tcp"]).is_err());
    }

    fn sandbox(args: &[&str]) -> Result<SandboxCmd, clap::Error> {
        let argv = ["space", "sandbox"].iter().chain(args).copied();
        Cli::try_parse_from(argv).map(|c| match c.command {
            Command::Sandbox(s) => s,
            other => panic!("{other:?}"),
        })
    }

    #[test]
    fn sandbox_create_takes_net_and_repeated_allow_and_deny_rules() {
        use space_proto::api::NetworkMode;
        let argv = [
            "create",
            "--net",
            "egress",
            "--allow",
            "pypi.org",
            "--allow",
            "*.github.com",
            "--deny",
            "10.0.0.0/8",
        ];
        match sandbox(&argv).expect("parses") {
            SandboxCmd::Create { network: n, .. } => {
                assert_eq!(n.net, Some(NetworkMode::Egress));
                assert_eq!(n.allow, ["pypi.org", "*.github.com"]);
                assert_eq!(n.deny, ["10.0.0.0/8"]);
            }
            other => panic!("{other:?}"),
        }
        match sandbox(&["create"]).expect("parses") {
            SandboxCmd::Create { network: n, .. } => {
                assert!(n.net.is_none() && n.allow.is_empty() && n.deny.is_empty());
            }
            other => panic!("{other:?}"),
        }
        match sandbox(&["create", "--net", "none"]).expect("parses") {
            SandboxCmd::Create { network, .. } => assert_eq!(network.net, Some(NetworkMode::None)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn net_is_none_or_egress_and_nothing_else() {
        for bad in ["on", "Egress", "", "full"] {
            for cmd in [
                &["create", "--net", bad][..],
                &["network", "sbx_x", "--net", bad],
            ] {
                let e = sandbox(cmd).expect_err(bad);
                assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue, "{cmd:?}");
            }
        }
    }

    #[test]
    fn sandbox_network_shows_without_net_and_replaces_with_it() {
        use space_proto::api::NetworkMode;
        match sandbox(&["network", "sbx_x"]).expect("parses") {
            SandboxCmd::Network { id, network: n } => {
                assert_eq!(id, "sbx_x");
                assert!(n.net.is_none() && n.allow.is_empty() && n.deny.is_empty());
            }
            other => panic!("{other:?}"),
        }
        let argv = [
            "network",
            "sbx_x",
            "--net",
            "egress",
            "--deny",
            "evil.example",
        ];
        match sandbox(&argv).expect("parses") {
            SandboxCmd::Network { network: n, .. } => {
                assert_eq!(
                    (n.net, n.deny),
                    (Some(NetworkMode::Egress), vec!["evil.example".to_owned()])
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(sandbox(&["network"]).is_err(), "the sandbox is required");
    }

    #[test]
    fn the_control_plane_gives_creates_no_network_unless_told_otherwise() {
        use space_proto::api::NetworkMode;
        if std::env::var_os("SPACE_NETWORK_DEFAULT").is_some() {
            eprintln!("SKIPPED: SPACE_NETWORK_DEFAULT set in the environment");
            return;
        }
        assert_eq!(up(&[]).network_default, NetworkMode::None);
        assert_eq!(
            up(&["--network-default", "egress"]).network_default,
            NetworkMode::Egress
        );
        let control = |args: &[&str]| {
            let argv = ["space", "control"].iter().chain(args).copied();
            match Cli::try_parse_from(argv).map(|c| c.command) {
                Ok(Command::Control(a)) => Ok(a.network_default),
                Ok(other) => panic!("{other:?}"),
                Err(e) => Err(e.kind()),
            }
        };
        assert_eq!(control(&[]), Ok(NetworkMode::None));
        assert_eq!(
            control(&["--network-default", "egress"]),
            Ok(NetworkMode::Egress)
        );
        assert_eq!(
            control(&["--network-default", "open"]),
            Err(clap::error::ErrorKind::InvalidValue)
        );
    }

    #[test]
    fn space_up_keeps_warm_jails_and_standby_sandboxes_per_worker_unless_told_otherwise() {
        if std::env::var_os("SPACE_STANDBY").is_some()
            || std::env::var_os("SPACE_WARM_POOL").is_some()
        {
            eprintln!("SKIPPED: SPACE_STANDBY / SPACE_WARM_POOL set in the environment");
            return;
        }
        let a = up(&[]);
        assert_eq!((a.warm_pool, a.standby()), (16, 32));
        assert_eq!(up(&["--workers", "3"]).standby(), 48);
        let off = up(&["--standby", "0", "--warm-pool", "0"]);
        assert_eq!((off.warm_pool, off.standby()), (0, 0));
        assert_eq!(up(&["--workers", "1", "--standby", "5"]).standby(), 5);
    }
}
