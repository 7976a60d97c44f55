//! Ports for loopback servers that are started after the port is chosen (the demo, the
//! benchmarks and the tests hand each service its address on its command line, and restart it
//! on the same one). A port chosen by binding `127.0.0.1:0` comes from the kernel's ephemeral
//! range, where every outgoing connection also takes its local port: with brokers, PostgreSQL,
//! gRPC and HTTP clients opening connections all the while, one of them can take the port
//! between the choice and the server's bind, which then fails with "Address already in use"
//! (seen in a demo test run alongside others). So the ports are chosen below that range, where
//! only explicit binds go, and checked free by binding them.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher as _, Hasher as _};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};

/// The lowest port chosen: above the ports servers are configured on by habit.
const LOWEST: u16 = 10_000;
/// Tries per port before falling back to a kernel-chosen one.
const TRIES: usize = 200;

/// `count` distinct ports free on 127.0.0.1 right now, below the ephemeral range where it
/// leaves room (else the kernel's choice).
pub fn free_loopback_ports(count: usize) -> io::Result<Vec<u16>> {
    // Ports from LOWEST on, below the ephemeral range, when that leaves room.
    let room = ephemeral_low()
        .unwrap_or(32_768)
        .checked_sub(LOWEST)
        .filter(|room| *room > 1_000);
    // Held until all are chosen, so no port is chosen twice.
    let mut held = Vec::with_capacity(count);
    let mut random = RandomState::new().build_hasher();
    for _ in 0..count {
        let chosen = room.and_then(|room| {
            (0..TRIES).find_map(|attempt| {
                random.write_usize(attempt);
                let port = LOWEST + (random.finish() % u64::from(room)) as u16;
                TcpListener::bind((Ipv4Addr::LOCALHOST, port)).ok()
            })
        });
        held.push(match chosen {
            Some(listener) => listener,
            None => TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?,
        });
    }
    held.iter()
        .map(|listener| Ok(listener.local_addr()?.port()))
        .collect()
}

/// [`free_loopback_ports`] for one address.
pub fn free_loopback_addr() -> io::Result<SocketAddr> {
    let port = free_loopback_ports(1)?[0];
    Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
}

/// The start of the kernel's ephemeral port range (Linux).
fn ephemeral_low() -> Option<u16> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_free_and_below_the_ephemeral_range() {
        let ports = free_loopback_ports(20).expect("ports");
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 20, "{ports:?}");
        let below = ephemeral_low().unwrap_or(32_768);
        let mut taken_since = Vec::new();
        for port in ports {
            if below > LOWEST + 1_000 {
                assert!(
                    (LOWEST..below).contains(&port),
                    "{port} not in {LOWEST}..{below}"
                );
            }
            // A child process another test forks while the ports are held keeps copies of the
            // listeners until it execs (their close-on-exec flag only acts then): under load that
            // takes a while, so a port is given a second to come free.
            let mut bound = TcpListener::bind((Ipv4Addr::LOCALHOST, port));
            for _ in 0..50 {
                if bound.is_ok() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
                bound = TcpListener::bind((Ipv4Addr::LOCALHOST, port));
            }
            if let Err(error) = bound {
                taken_since.push((port, error.kind()));
            }
        }
        // Free once released, except that on a shared machine (the whole suite runs beside the
        // stack) another process may bind one of them in between, as the module's doc says a
        // server's own bind can meet: once, in a full run. More than one is not chance.
        assert!(
            taken_since.len() <= 1,
            "not free once released: {taken_since:?}"
        );
    }
}
