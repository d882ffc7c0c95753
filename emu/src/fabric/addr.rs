//! Which emulated port an IP address names: the address model the connection manager resolves
//! by (`rdma_resolve_addr`, `rdma_bind_addr`) and that a RoCE port's GIDs follow.
//!
//! By default `127.0.0.1` and `::1` (so `localhost`) and this host's own addresses (those of
//! its network interfaces) name port 1 of the first device. More
//! addresses map to other devices and ports through [`FabricConfig::addresses`]
//! (`RDMA_EMU_ADDRS=127.0.0.2=emu1:1,...` for the C library), so that two devices of one
//! process can be told apart.
//!
//! [`FabricConfig::addresses`]: crate::FabricConfig::addresses

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An IP address of an emulated port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAddress {
    pub ip: IpAddr,
    /// The device's index (`emu<N>`).
    pub device: u32,
    pub port: u8,
}

impl PortAddress {
    /// Parses `RDMA_EMU_ADDRS`: comma-separated `IP=DEVICE:PORT`, the device by name
    /// (`emu1`) or index, the port 1 when left out.
    pub fn parse_list(s: &str) -> Result<Vec<PortAddress>, crate::ConfigError> {
        let bad = |e: &str| {
            crate::ConfigError(format!("RDMA_EMU_ADDRS entry {e:?}: want IP=emuN[:PORT]"))
        };
        s.split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (ip, at) = e.split_once('=').ok_or_else(|| bad(e))?;
                let ip: IpAddr = ip.trim().parse().map_err(|_| bad(e))?;
                let (dev, port) = at.split_once(':').unwrap_or((at, "1"));
                let dev = dev.trim();
                let device = dev.strip_prefix("emu").unwrap_or(dev).parse().map_err(|_| bad(e))?;
                let port = port.trim().parse().ok().filter(|&p| p >= 1).ok_or_else(|| bad(e))?;
                Ok(PortAddress { ip, device, port })
            })
            .collect()
    }

    /// Parses `RDMA_EMU_WIRE`: comma-separated `IP[=DEVICE[:PORT]]`, port 1 of device `emu0`
    /// when left out.
    pub fn parse_wire_list(s: &str) -> Result<Vec<PortAddress>, crate::ConfigError> {
        let entries = s.split(',').map(str::trim).filter(|e| !e.is_empty());
        entries
            .map(|e| {
                let full = if e.contains('=') { e.to_owned() } else { format!("{e}=emu0") };
                let mut one = PortAddress::parse_list(&full).map_err(|_| {
                    crate::ConfigError(format!("RDMA_EMU_WIRE entry {e:?}: want IP[=emuN[:PORT]]"))
                })?;
                Ok(one.remove(0))
            })
            .collect()
    }
}

/// The addresses of a fabric's ports.
#[derive(Debug, Clone)]
pub(crate) struct AddressMap {
    entries: Vec<PortAddress>,
}

impl AddressMap {
    /// The configured addresses, then the default ones that are not taken by them: loopback's
    /// and the host's own.
    pub(crate) fn new(configured: &[PortAddress]) -> AddressMap {
        AddressMap::with(configured, &crate::sys::host_addresses())
    }

    /// The configured addresses, then loopback's and `host`'s on port 1 of the first device,
    /// each address once (a configured one wins).
    fn with(configured: &[PortAddress], host: &[IpAddr]) -> AddressMap {
        let mut entries = configured.to_vec();
        let loopback = [IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V6(Ipv6Addr::LOCALHOST)];
        for &ip in loopback.iter().chain(host) {
            if !entries.iter().any(|e| e.ip == ip) {
                entries.push(PortAddress { ip, device: 0, port: 1 });
            }
        }
        AddressMap { entries }
    }

    /// The port `ip` names; an IPv4-mapped IPv6 address names what its IPv4 address does.
    pub(crate) fn port_of(&self, ip: IpAddr) -> Option<(u32, u8)> {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.entries.iter().find(|e| e.ip == ip).map(|e| (e.device, e.port))
    }

    /// Every address of port `port` of device `device`.
    pub(crate) fn addresses_of(&self, device: u32, port: u8) -> Vec<IpAddr> {
        let mine = self.entries.iter().filter(|e| e.device == device && e.port == port);
        mine.map(|e| e.ip).collect()
    }

    /// An address of port `port` of device `device`, of the family of `like` if it has one.
    pub(crate) fn address_of(&self, device: u32, port: u8, like: IpAddr) -> Option<IpAddr> {
        let mine = || self.entries.iter().filter(|e| e.device == device && e.port == port);
        mine().find(|e| e.ip.is_ipv4() == like.is_ipv4()).or_else(|| mine().next()).map(|e| e.ip)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn test_loopback_names_the_first_port_and_the_setting_adds_others() {
        let more = PortAddress::parse_list("127.0.0.2=emu1, 10.1.2.3=0:2").unwrap();
        assert_eq!(more[1], PortAddress { ip: "10.1.2.3".parse().unwrap(), device: 0, port: 2 });
        let m = AddressMap::with(&more, &[]);
        assert_eq!(m.port_of("127.0.0.1".parse().unwrap()), Some((0, 1)));
        assert_eq!(m.port_of("::1".parse().unwrap()), Some((0, 1)));
        assert_eq!(m.port_of("::ffff:127.0.0.2".parse().unwrap()), Some((1, 1)));
        assert_eq!(m.port_of("192.0.2.1".parse().unwrap()), None);
        let v6: IpAddr = "::".parse().unwrap();
        assert_eq!(m.address_of(0, 1, v6), Some("::1".parse().unwrap()));
        assert!(PortAddress::parse_list("1.2.3.4=emu1:0").is_err());
        assert!(PortAddress::parse_list("nonsense").is_err());
    }

    #[test]
    fn test_the_hosts_own_addresses_name_the_first_port_unless_configured() {
        let host: [IpAddr; 2] = ["198.51.100.7".parse().unwrap(), "2001:db8::7".parse().unwrap()];
        let mine = PortAddress::parse_list("2001:db8::7=emu1").unwrap();
        let m = AddressMap::with(&mine, &host);
        assert_eq!(m.port_of(host[0]), Some((0, 1)));
        assert_eq!(m.port_of(host[1]), Some((1, 1)), "the setting wins");
        // The real host's addresses are in the default map (loopback at least).
        let real = crate::sys::host_addresses();
        let d = AddressMap::new(&[]);
        assert!(real.iter().all(|ip| d.port_of(*ip).is_some()), "{real:?}");
    }
}
