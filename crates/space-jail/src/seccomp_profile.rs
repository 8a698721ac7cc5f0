//! The jail's seccomp profile, declared as data so it can be reviewed in one place
//! and tested as data.
//!
//! The profile is a deny-list: a sandbox runs arbitrary user programs (shells,
//! compilers, interpreters), so an allow-list would break them in ways nobody can
//! predict. What is denied is what a sandboxed workload never needs and what widens
//! the kernel's attack surface or reaches outside the jail: mounts and namespaces,
//! kernel modules and kexec, tracing other processes, BPF, keyrings, the clock,
//! swap and quotas, io_uring (its operations bypass seccomp). Most of these also
//! need capabilities the jail has dropped; the filter is the second wall.
//!
//! Denied calls fail with `EPERM`, the answer programs already handle for
//! "not allowed here", except `clone3`, which fails with `ENOSYS` so that libc
//! falls back to `clone`, whose flags the filter can inspect.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// One system call the jail refuses outright, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denial {
    /// The libc constant naming the call (`SYS_mount`).
    pub constant: &'static str,
    /// Its number on the build's architecture.
    pub nr: i64,
    /// Why a sandbox has no business calling it.
    pub why: &'static str,
}

macro_rules! deny {
    ($nr:ident, $why:expr) => {
        Denial {
            constant: stringify!($nr),
            nr: libc::$nr,
            why: $why,
        }
    };
}

impl Denial {
    /// The call's name, as in `syscalls(2)`.
    pub fn name(&self) -> &'static str {
        self.constant.trim_start_matches("SYS_")
    }
}

/// Calls refused on every architecture.
pub const DENIED_SYSCALLS: &[Denial] = &[
    // The filesystem view is fixed by the jail; changing it is escaping it.
    deny!(
        SYS_mount,
        "the jail's mounts are fixed before the agent starts"
    ),
    deny!(
        SYS_umount2,
        "unmounting could expose what the overlay hides"
    ),
    deny!(SYS_pivot_root, "the root is chosen by the jail"),
    deny!(SYS_chroot, "the root is chosen by the jail"),
    deny!(SYS_fsopen, "new mount API"),
    deny!(SYS_fsconfig, "new mount API"),
    deny!(SYS_fsmount, "new mount API"),
    deny!(SYS_fspick, "new mount API"),
    deny!(SYS_move_mount, "new mount API"),
    deny!(SYS_open_tree, "new mount API: clones mount trees"),
    deny!(SYS_mount_setattr, "new mount API: changes mount flags"),
    // Namespaces: new ones (user namespaces above all) are a classic kernel attack
    // surface; joining others is leaving the jail.
    deny!(SYS_unshare, "no new namespaces inside the sandbox"),
    deny!(SYS_setns, "joining another namespace is leaving the jail"),
    // The kernel itself.
    deny!(SYS_kexec_load, "replaces the running kernel"),
    deny!(SYS_kexec_file_load, "replaces the running kernel"),
    deny!(SYS_init_module, "loads kernel code"),
    deny!(SYS_finit_module, "loads kernel code"),
    deny!(SYS_delete_module, "unloads kernel code"),
    deny!(SYS_reboot, "host power state"),
    deny!(SYS_swapon, "host swap configuration"),
    deny!(SYS_swapoff, "host swap configuration"),
    deny!(SYS_acct, "host process accounting"),
    deny!(SYS_quotactl, "host disk quotas"),
    deny!(SYS_quotactl_fd, "host disk quotas"),
    deny!(SYS_syslog, "reads the host's kernel log"),
    // Other processes' memory and descriptors.
    deny!(
        SYS_ptrace,
        "tracing is a sandbox-internal escalation path and a kernel attack surface"
    ),
    deny!(SYS_process_vm_readv, "reads another process's memory"),
    deny!(SYS_process_vm_writev, "writes another process's memory"),
    deny!(SYS_kcmp, "compares kernel objects of other processes"),
    deny!(SYS_pidfd_getfd, "steals another process's descriptors"),
    // Kernel attack surface with no use in a sandbox.
    deny!(
        SYS_perf_event_open,
        "performance counters leak host activity"
    ),
    deny!(SYS_bpf, "loads programs into the kernel"),
    deny!(
        SYS_userfaultfd,
        "a staple of kernel exploits (stalling page faults)"
    ),
    deny!(SYS_keyctl, "kernel keyrings are not namespaced"),
    deny!(SYS_add_key, "kernel keyrings are not namespaced"),
    deny!(SYS_request_key, "kernel keyrings are not namespaced"),
    deny!(
        SYS_open_by_handle_at,
        "opens files by handle, bypassing the mount tree (shocker)"
    ),
    deny!(SYS_name_to_handle_at, "companion of open_by_handle_at"),
    deny!(SYS_io_uring_setup, "io_uring operations bypass seccomp"),
    deny!(SYS_io_uring_enter, "io_uring operations bypass seccomp"),
    deny!(SYS_io_uring_register, "io_uring operations bypass seccomp"),
    deny!(
        SYS_migrate_pages,
        "moves another process's memory between NUMA nodes"
    ),
    deny!(
        SYS_move_pages,
        "moves another process's memory between NUMA nodes"
    ),
    // The clock and the host's names are shared with the host.
    deny!(SYS_clock_settime, "the clock is the host's"),
    deny!(SYS_settimeofday, "the clock is the host's"),
    deny!(SYS_clock_adjtime, "the clock is the host's"),
    deny!(SYS_sethostname, "the hostname is set by the jail"),
    deny!(SYS_setdomainname, "the domain name is set by the jail"),
];

/// Obsolete or x86-only calls refused where they exist.
#[cfg(target_arch = "x86_64")]
pub const DENIED_ARCH_SYSCALLS: &[Denial] = &[
    deny!(SYS_uselib, "obsolete loader entry point"),
    deny!(SYS_ustat, "obsolete"),
    deny!(SYS_sysfs, "obsolete"),
    deny!(SYS__sysctl, "obsolete"),
    deny!(SYS_iopl, "raw I/O port access"),
    deny!(SYS_ioperm, "raw I/O port access"),
    deny!(SYS_vhangup, "hangs up the controlling terminal"),
    deny!(SYS_lookup_dcookie, "profiling interface"),
];

/// Obsolete or x86-only calls refused where they exist.
#[cfg(not(target_arch = "x86_64"))]
pub const DENIED_ARCH_SYSCALLS: &[Denial] = &[];

/// `clone` flags that create namespaces; `clone` with any of them is refused like
/// `unshare`. (`CLONE_NEWTIME` is absent: for `clone` its bit is part of the exit
/// signal.)
pub const DENIED_CLONE_FLAGS: &[(&str, u64)] = &[
    ("CLONE_NEWNS", libc::CLONE_NEWNS as u64),
    ("CLONE_NEWUTS", libc::CLONE_NEWUTS as u64),
    ("CLONE_NEWIPC", libc::CLONE_NEWIPC as u64),
    ("CLONE_NEWUSER", libc::CLONE_NEWUSER as u64),
    ("CLONE_NEWPID", libc::CLONE_NEWPID as u64),
    ("CLONE_NEWNET", libc::CLONE_NEWNET as u64),
    ("CLONE_NEWCGROUP", libc::CLONE_NEWCGROUP as u64),
];

/// Personas `personality(2)` may still select: Linux itself, 32-bit Linux, the
/// `uname26` compatibility flag, and the query value. Everything else (e.g.
/// `READ_IMPLIES_EXEC`, `ADDR_NO_RANDOMIZE`) weakens exploit mitigations.
pub const ALLOWED_PERSONAS: &[u64] = &[0x0000, 0x0008, 0x0002_0000, 0x0002_0008, 0xffff_ffff];

/// Socket families `socket(2)` refuses: `AF_VSOCK` reaches the hypervisor and the
/// host's vsock services (a microVM host's agents), never needed inside a jail.
pub const DENIED_SOCKET_FAMILIES: &[(&str, u64)] = &[("AF_VSOCK", libc::AF_VSOCK as u64)];

/// `ioctl` requests refused: pushing input into a terminal someone else reads.
// The request type is `c_ulong` or `c_int` depending on the target.
#[allow(clippy::unnecessary_cast)]
pub const DENIED_IOCTLS: &[(&str, u64)] = &[
    ("TIOCSTI", libc::TIOCSTI as u64),
    ("TIOCLINUX", libc::TIOCLINUX as u64),
];

/// Why compiling the profile failed (a bug in this module, never a runtime state).
#[derive(Debug)]
pub struct ProfileError(pub seccompiler::BackendError);

impl std::fmt::Display for ProfileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "seccomp profile does not compile: {}", self.0)
    }
}

impl std::error::Error for ProfileError {}

/// Every call number the profile refuses unconditionally.
pub fn denied_numbers() -> impl Iterator<Item = i64> {
    DENIED_SYSCALLS
        .iter()
        .chain(DENIED_ARCH_SYSCALLS)
        .map(|d| d.nr)
}

/// Whether `nr` is refused whatever its arguments.
pub fn is_denied(nr: i64) -> bool {
    denied_numbers().any(|d| d == nr)
}

fn target_arch() -> Result<TargetArch, ProfileError> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(ProfileError)
}

fn condition(
    arg: u8,
    op: SeccompCmpOp,
    value: u64,
) -> Result<SeccompCondition, seccompiler::BackendError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
}

/// The `EPERM` part: unconditional denials plus the argument-dependent ones.
fn eperm_rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, seccompiler::BackendError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in denied_numbers() {
        // An empty rule list matches every invocation.
        rules.insert(nr, Vec::new());
    }
    // Rules of one call are alternatives: any namespace flag matches.
    let clone_rules = DENIED_CLONE_FLAGS
        .iter()
        .map(|&(_, flag)| SeccompRule::new(vec![condition(0, SeccompCmpOp::MaskedEq(flag), flag)?]))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_clone, clone_rules);
    // Conditions of one rule all hold: the persona is none of the allowed ones.
    let persona_conditions = ALLOWED_PERSONAS
        .iter()
        .map(|&p| condition(0, SeccompCmpOp::Ne, p))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(
        libc::SYS_personality,
        vec![SeccompRule::new(persona_conditions)?],
    );
    let ioctl_rules = DENIED_IOCTLS
        .iter()
        .map(|&(_, req)| SeccompRule::new(vec![condition(1, SeccompCmpOp::Eq, req)?]))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_ioctl, ioctl_rules);
    let socket_rules = DENIED_SOCKET_FAMILIES
        .iter()
        .map(|&(_, family)| SeccompRule::new(vec![condition(0, SeccompCmpOp::Eq, family)?]))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_socket, socket_rules);
    Ok(rules)
}

/// Compiles the profile into the BPF programs to install, in order.
///
/// Two programs because seccompiler gives one match action per filter: the
/// `EPERM` deny-list, and `clone3` → `ENOSYS`. The kernel runs both; an `ERRNO`
/// from either beats the other's `ALLOW`.
pub fn compile() -> Result<Vec<BpfProgram>, ProfileError> {
    let arch = target_arch()?;
    let eperm = SeccompFilter::new(
        eperm_rules().map_err(ProfileError)?,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(ProfileError)?;
    let enosys = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(ProfileError)?;
    let mut programs = vec![
        eperm.try_into().map_err(ProfileError)?,
        enosys.try_into().map_err(ProfileError)?,
    ];
    #[cfg(target_arch = "x86_64")]
    programs.push(x32_guard());
    Ok(programs)
}

/// x32 system calls are x86-64 calls with bit 30 of the number set, under the same
/// audit architecture: a deny-list keyed by x86-64 numbers would not see them on a
/// kernel built with `CONFIG_X86_X32_ABI`. This program refuses every one (`EPERM`).
#[cfg(target_arch = "x86_64")]
fn x32_guard() -> BpfProgram {
    use seccompiler::sock_filter;
    // BPF_LD | BPF_W | BPF_ABS (the first two are 0).
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JEQ_K: u16 = 0x05 | 0x10;
    const BPF_JGE_K: u16 = 0x05 | 0x30;
    const BPF_RET_K: u16 = 0x06;
    const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    let op = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        // struct seccomp_data: nr at 0, arch at 4.
        op(BPF_LD_W_ABS, 0, 0, 4),
        op(BPF_JEQ_K, 0, 3, AUDIT_ARCH_X86_64),
        op(BPF_LD_W_ABS, 0, 0, 0),
        op(BPF_JGE_K, 0, 1, X32_SYSCALL_BIT),
        op(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | libc::EPERM as u32),
        op(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]
}

/// Installs the compiled programs on the calling thread (which also sets
/// `no_new_privs`, required to filter without `CAP_SYS_ADMIN`).
pub fn install(programs: &[BpfProgram]) -> Result<(), seccompiler::Error> {
    for program in programs {
        seccompiler::apply_filter(program)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calls the design names explicitly (ARCHITECTURE.md, the jail brief).
    const MUST_DENY: &[(&str, i64)] = &[
        ("mount", libc::SYS_mount),
        ("umount2", libc::SYS_umount2),
        ("pivot_root", libc::SYS_pivot_root),
        ("kexec_load", libc::SYS_kexec_load),
        ("kexec_file_load", libc::SYS_kexec_file_load),
        ("bpf", libc::SYS_bpf),
        ("init_module", libc::SYS_init_module),
        ("finit_module", libc::SYS_finit_module),
        ("delete_module", libc::SYS_delete_module),
        ("ptrace", libc::SYS_ptrace),
        ("process_vm_readv", libc::SYS_process_vm_readv),
        ("process_vm_writev", libc::SYS_process_vm_writev),
        ("keyctl", libc::SYS_keyctl),
        ("add_key", libc::SYS_add_key),
        ("request_key", libc::SYS_request_key),
        ("unshare", libc::SYS_unshare),
        ("setns", libc::SYS_setns),
        ("open_by_handle_at", libc::SYS_open_by_handle_at),
        ("swapon", libc::SYS_swapon),
        ("swapoff", libc::SYS_swapoff),
        ("reboot", libc::SYS_reboot),
        ("acct", libc::SYS_acct),
        ("quotactl", libc::SYS_quotactl),
        ("perf_event_open", libc::SYS_perf_event_open),
        ("userfaultfd", libc::SYS_userfaultfd),
        ("clock_settime", libc::SYS_clock_settime),
        ("settimeofday", libc::SYS_settimeofday),
    ];

    /// Calls every ordinary program makes; refusing any would break workloads.
    const MUST_ALLOW: &[(&str, i64)] = &[
        ("read", libc::SYS_read),
        ("write", libc::SYS_write),
        ("openat", libc::SYS_openat),
        ("close", libc::SYS_close),
        ("mmap", libc::SYS_mmap),
        ("execve", libc::SYS_execve),
        ("wait4", libc::SYS_wait4),
        ("socket", libc::SYS_socket),
        ("connect", libc::SYS_connect),
        ("getpid", libc::SYS_getpid),
        ("exit_group", libc::SYS_exit_group),
        ("clone", libc::SYS_clone),
        ("ioctl", libc::SYS_ioctl),
        ("personality", libc::SYS_personality),
        ("seccomp", libc::SYS_seccomp),
    ];

    #[test]
    fn every_syscall_the_design_names_is_denied() {
        for &(name, nr) in MUST_DENY {
            assert!(is_denied(nr), "{name} ({nr}) must be denied");
        }
    }

    #[test]
    fn ordinary_syscalls_are_not_denied_unconditionally() {
        for &(name, nr) in MUST_ALLOW {
            assert!(!is_denied(nr), "{name} ({nr}) must stay available");
        }
    }

    #[test]
    fn each_denial_names_its_own_number_once_and_says_why() {
        let all: Vec<&Denial> = DENIED_SYSCALLS.iter().chain(DENIED_ARCH_SYSCALLS).collect();
        for (i, d) in all.iter().enumerate() {
            assert!(!d.why.is_empty(), "{} has no reason", d.name());
            assert!(
                all.iter().skip(i + 1).all(|other| other.nr != d.nr),
                "{} is listed twice",
                d.name()
            );
        }
        let mount = all.iter().find(|d| d.name() == "mount").unwrap();
        assert_eq!(mount.nr, libc::SYS_mount);
    }

    #[test]
    fn namespace_clone_flags_and_odd_personas_are_conditional_denials() {
        let rules = eperm_rules().unwrap();
        assert_eq!(rules[&libc::SYS_clone].len(), DENIED_CLONE_FLAGS.len());
        assert!(
            DENIED_CLONE_FLAGS
                .iter()
                .any(|&(n, _)| n == "CLONE_NEWUSER")
        );
        // A plain fork's flags (SIGCHLD in the low byte) carry no namespace bit.
        let fork_flags =
            libc::SIGCHLD as u64 | (libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID) as u64;
        assert!(DENIED_CLONE_FLAGS.iter().all(|&(_, f)| fork_flags & f == 0));
        assert_eq!(rules[&libc::SYS_personality].len(), 1);
        assert!(
            ALLOWED_PERSONAS.contains(&0xffff_ffff),
            "querying the persona must work"
        );
        assert_eq!(rules[&libc::SYS_ioctl].len(), DENIED_IOCTLS.len());
    }

    #[test]
    fn profile_compiles_to_its_programs() {
        let programs = compile().unwrap();
        // The deny-list, clone3 → ENOSYS, and on x86-64 the x32 guard.
        let expected = if cfg!(target_arch = "x86_64") { 3 } else { 2 };
        assert_eq!(programs.len(), expected);
        assert!(programs.iter().all(|p| !p.is_empty()));
        // BPF programs are limited to 4096 instructions.
        assert!(programs.iter().all(|p| p.len() < 4096));
    }
}
