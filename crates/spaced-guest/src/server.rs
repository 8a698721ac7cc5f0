//! The accept loop: one thread per connection, a bounded number at once.

use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use space_proto::guest::{
    Activation, AgentBody, CONNECTION, ErrorKind, MAX_ACTIVATION_LEN, WireError,
};

pub use crate::agent::Agent;
use crate::config::{ActivationSource, Config, ListenSource};
use crate::conn::DontWait;
use crate::{session, sys};

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The listening socket could not be set up.
    #[error("listener: {0}")]
    Listener(io::Error),
    /// The activation record could not be read.
    #[error("activation: {0}")]
    ActivationIo(io::Error),
    /// The activation record is invalid.
    #[error(transparent)]
    Activation(#[from] space_proto::guest::ActivationError),
}

/// Reads the activation record and sets up the listener, as `config` says.
pub fn start(config: &Config) -> Result<(Arc<Agent>, OwnedFd), StartError> {
    sys::close_inherited_on_exec().map_err(StartError::Listener)?;
    let activation = read_activation(&config.activation)?;
    let listener = open_listener(&config.listen).map_err(StartError::Listener)?;
    let agent = Agent::new(&activation, config.home.clone(), config.max_connections);
    Ok((Arc::new(agent), listener))
}

fn read_activation(source: &ActivationSource) -> Result<Activation, StartError> {
    let reader: Box<dyn Read> = match source {
        ActivationSource::Fd(fd) => Box::new(std::fs::File::from(
            sys::adopt_inherited_fd(*fd).map_err(StartError::ActivationIo)?,
        )),
        ActivationSource::File(path) => {
            Box::new(std::fs::File::open(path).map_err(StartError::ActivationIo)?)
        }
    };
    // One byte over the cap is enough to know the record is too long.
    let mut bytes = Vec::new();
    reader
        .take(MAX_ACTIVATION_LEN as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(StartError::ActivationIo)?;
    // The reader (and with it an inherited descriptor) is closed here, so no child
    // can ever inherit the secret's channel.
    Ok(Activation::decode(&bytes)?)
}

fn open_listener(source: &ListenSource) -> io::Result<OwnedFd> {
    let fd = match source {
        ListenSource::Fd(fd) => sys::adopt_inherited_fd(*fd)?,
        ListenSource::Path(path) => OwnedFd::from(UnixListener::bind(path)?),
    };
    // Inherited descriptors come without close-on-exec; without it every process the
    // agent spawns would hold the listener.
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC)?;
    if !rustix::net::sockopt::socket_acceptconn(&fd)? {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "descriptor is not a listening socket",
        ));
    }
    // Listen again from this process: a connecting peer's SO_PEERCRED names the process
    // that last called listen(2), and the bridge checks that it is this agent, not the
    // launcher that bound the socket.
    rustix::net::listen(&fd, 1024)?;
    Ok(fd)
}

/// Decrements the connection count however the connection thread ends.
struct Slot(Arc<Agent>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Accepts connections forever. Works with any stream listener (Unix or vsock):
/// accepted sockets are used only through `read`/`write`.
pub fn serve(agent: Arc<Agent>, listener: OwnedFd) -> io::Result<()> {
    loop {
        let fd = match rustix::net::accept_with(listener.as_fd(), rustix::net::SocketFlags::CLOEXEC)
        {
            Ok(fd) => fd,
            Err(e) if e == rustix::io::Errno::INTR || e == rustix::io::Errno::CONNABORTED => {
                continue;
            }
            Err(e)
                if e == rustix::io::Errno::MFILE
                    || e == rustix::io::Errno::NFILE
                    || e == rustix::io::Errno::NOBUFS
                    || e == rustix::io::Errno::NOMEM =>
            {
                // Out of descriptors or memory: back off instead of spinning; the
                // pending connection waits in the backlog.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        take(&agent, UnixStream::from(fd));
    }
}

/// Serves one connection on a thread of its own, or answers `busy` past the limit.
pub(crate) fn take(agent: &Arc<Agent>, stream: UnixStream) {
    if agent.active.fetch_add(1, Ordering::AcqRel) >= agent.max_connections {
        agent.active.fetch_sub(1, Ordering::AcqRel);
        refuse_busy(agent, stream);
        return;
    }
    let slot = Slot(agent.clone());
    let spawned = std::thread::Builder::new()
        .name("conn".into())
        // Address space, not memory: only touched pages count. Enough for std's
        // per-component recursion in `create_dir_all` on the longest paths.
        .stack_size(2 << 20)
        .spawn(move || {
            let _ = session::serve(stream, &slot.0);
        });
    if spawned.is_err() {
        // The closure (and with it the slot and stream) was dropped: the client
        // sees the connection close.
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn refuse_busy(agent: &Agent, stream: UnixStream) {
    let msg = space_proto::guest::AgentFrame {
        execution_id: agent.identity.execution.id,
        request_id: CONNECTION,
        body: AgentBody::Error(WireError::new(ErrorKind::Busy, "too many connections")),
    };
    if let Ok(bytes) = space_proto::frame::frame_bytes(&space_proto::codec::encode(&msg)) {
        // Never block the accept loop on a peer that does not read.
        let _ = std::io::Write::write(&mut DontWait(&stream), &bytes);
    }
}
