//! TCP ports for driving server/client programs (perftest, the rdma-core examples): a free
//! one to give them, and whether a server listens on it yet. Shared with the shim's legacy
//! tests (`provider-shim/tests/legacy.rs` includes this file).

/// A TCP port on 127.0.0.1 nobody listens on (the kernel's pick, released at once).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Whether something listens on TCP `port`, read from /proc: a probe connection would be
/// taken as the client by the one-shot servers.
pub fn listening(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).unwrap_or_default().lines().skip(1).any(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.len() > 3
                && cols[3] == "0A"
                && cols[1].rsplit(':').next() == Some(&format!("{port:04X}"))
        })
    })
}
