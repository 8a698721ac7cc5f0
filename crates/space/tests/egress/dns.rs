//! The test's upstream DNS server: UDP on 127.0.0.1 (an ephemeral port), answering
//! `A` questions for the names the test maps from a fixed table, `NXDOMAIN` for any
//! other name, no records for other types. It counts the questions it saw per name,
//! so a test can tell that a refused name never left the platform's resolver.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use space_egress::dns::{self, Rcode, TYPE_A};

/// TTL of every answer: short, so the platform's cache never outlives a test's step.
const TTL: u32 = 1;

/// How often the serving thread looks at its stop flag.
const POLL: Duration = Duration::from_millis(100);

/// A running server; stopped on drop.
pub struct DnsServer {
    pub addr: SocketAddr,
    asked: Arc<Mutex<HashMap<String, usize>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl DnsServer {
    /// Serves `names` (lowercase, no trailing dot) → one IPv4 address each.
    pub fn start(names: &[(&str, Ipv4Addr)]) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").expect("bind the test DNS server");
        socket.set_read_timeout(Some(POLL)).expect("a read timeout");
        let addr = socket.local_addr().expect("its address");
        let table: HashMap<String, Ipv4Addr> =
            names.iter().map(|(n, a)| ((*n).to_owned(), *a)).collect();
        let asked = Arc::new(Mutex::new(HashMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let asked = Arc::clone(&asked);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || serve(&socket, &table, &asked, &stop))
        };
        DnsServer {
            addr,
            asked,
            stop,
            thread: Some(thread),
        }
    }

    /// How many questions (of any type) for `name` arrived.
    pub fn asked(&self, name: &str) -> usize {
        let asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        asked.get(name).copied().unwrap_or(0)
    }
}

fn serve(
    socket: &UdpSocket,
    table: &HashMap<String, Ipv4Addr>,
    asked: &Mutex<HashMap<String, usize>>,
    stop: &AtomicBool,
) {
    let mut buf = [0u8; dns::MAX_UDP_MESSAGE];
    while !stop.load(Ordering::Relaxed) {
        let Ok((n, from)) = socket.recv_from(&mut buf) else {
            continue;
        };
        let Ok(query) = dns::parse_query(&buf[..n]) else {
            if let Some(reply) = dns::error_reply(&buf[..n], Rcode::FormErr) {
                let _ = socket.send_to(&reply, from);
            }
            continue;
        };
        *asked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(query.name.clone())
            .or_default() += 1;
        let reply = match table.get(&query.name) {
            Some(addr) if query.qtype == TYPE_A => dns::answer(&query, &[IpAddr::V4(*addr)], TTL),
            Some(_) => dns::answer(&query, &[], TTL),
            None => dns::reply_without_records(&query, Rcode::NxDomain),
        };
        let _ = socket.send_to(&reply, from);
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
