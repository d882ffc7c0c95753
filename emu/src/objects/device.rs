//! Devices and their ports: identity, attribute tables, GID and P_Key tables, the key space.

use std::sync::{
    Arc,
    atomic::{AtomicU32, Ordering},
};

use crate::sync::Mutex;

use super::{context::Context, keys::Keys};
use crate::{
    error::{Errno, Error, Result, einval},
    fabric::FabricInner,
    profile::{DeviceAttr, DeviceIdentity, GidEntry, PortAttr, Profile},
    types::{Gid, LinkLayer},
};

/// One port of a device. Ports are numbered from 1 as in verbs.
#[derive(Debug)]
pub(crate) struct PortInner {
    pub(crate) attr: Mutex<PortAttr>,
    pub(crate) gids: Vec<GidEntry>,
    pub(crate) pkeys: Vec<u16>,
    /// Whether the link is up (ACTIVE), readable per packet without the attribute lock.
    pub(crate) up: std::sync::atomic::AtomicBool,
}

/// Counters that enforce the device's `max_*` limits.
#[derive(Debug, Default)]
pub(crate) struct ResourceCounts {
    pub(crate) pd: AtomicU32,
    pub(crate) mr: AtomicU32,
    pub(crate) cq: AtomicU32,
    pub(crate) qp: AtomicU32,
    pub(crate) ah: AtomicU32,
    pub(crate) srq: AtomicU32,
    pub(crate) mw: AtomicU32,
    pub(crate) wq: AtomicU32,
    pub(crate) ind_table: AtomicU32,
}

impl ResourceCounts {
    /// Takes one unit of `counter` unless `max` are in use (then `ENOMEM`, as rxe's pools do).
    pub(crate) fn take(counter: &AtomicU32, max: u32, what: &'static str) -> Result<()> {
        counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| (c < max).then(|| c + 1))
            .map(|_| ())
            .map_err(|_| Error::new(Errno::ENOMEM, what))
    }

    pub(crate) fn give(counter: &AtomicU32) {
        counter.fetch_sub(1, Ordering::AcqRel);
    }
}

#[derive(Debug)]
pub(crate) struct DeviceInner {
    pub(crate) name: String,
    pub(crate) profile: Profile,
    pub(crate) id: DeviceIdentity,
    pub(crate) attr: DeviceAttr,
    pub(crate) ports: Vec<PortInner>,
    /// lkeys and rkeys of this device's MRs and MWs (one key space, as in rxe), behind the
    /// fabric's key lock.
    pub(crate) keys: Keys,
    /// XRC domains opened on a file, by the file's identity (shared by every open of it).
    pub(crate) xrcds: Mutex<Vec<(super::xrcd::FileId, std::sync::Weak<super::xrcd::XrcdInner>)>>,
    /// The next SRQ number.
    pub(crate) next_srqn: AtomicU32,
    /// The next WQ or indirection table number.
    pub(crate) next_wqn: AtomicU32,
    pub(crate) counts: ResourceCounts,
    /// Bytes of device memory allocated (of `attr.max_dm_size`).
    pub(crate) dm_used: std::sync::atomic::AtomicU64,
    /// Open contexts, to deliver port and device events to.
    pub(crate) contexts: Mutex<Vec<std::sync::Weak<super::context::ContextInner>>>,
}

impl DeviceInner {
    /// Device `index` with `ports` ports of `link` layer over netdevs of MTU `netdev_mtu`,
    /// whose port `p` has the IP addresses `addrs(p)`.
    pub(crate) fn new(
        index: u32,
        profile: Profile,
        (ports, link, netdev_mtu): (u8, LinkLayer, Option<u32>),
        addrs: impl Fn(u8) -> Vec<std::net::IpAddr>,
        keys_lock: std::sync::Arc<crate::sync::ReadMostly<()>>,
    ) -> DeviceInner {
        let id = DeviceIdentity::new(index);
        let n = profile.port_count(ports);
        let port_attr = |p| {
            let mut attr = profile.port_attr(&id, p, n, link);
            if let Some(mtu) = netdev_mtu.filter(|_| attr.link_layer == LinkLayer::ETHERNET) {
                attr.active_mtu = profile.roce_active_mtu(mtu);
            }
            attr
        };
        let ports = (1..=n)
            .map(|p| PortInner {
                attr: Mutex::new(port_attr(p)),
                gids: profile.gid_table(&id, p, link, &addrs(p)),
                pkeys: profile.pkey_table(),
                up: std::sync::atomic::AtomicBool::new(true),
            })
            .collect();
        DeviceInner {
            name: format!("emu{index}"),
            profile,
            attr: profile.device_attr(&id, n),
            id,
            ports,
            keys: Keys::new(keys_lock),
            xrcds: Mutex::new(Vec::new()),
            next_srqn: AtomicU32::new(1),
            next_wqn: AtomicU32::new(1),
            counts: ResourceCounts::default(),
            dm_used: Default::default(),
            contexts: Mutex::new(Vec::new()),
        }
    }

    /// The port numbered `num` (1-based), or `EINVAL`.
    pub(crate) fn port(&self, num: u8) -> Result<&PortInner> {
        (num as usize).checked_sub(1).and_then(|i| self.ports.get(i)).ok_or(einval("no such port"))
    }

    pub(crate) fn has_gid(&self, gid: &Gid) -> Option<u8> {
        self.ports.iter().position(|p| p.gids.iter().any(|e| e.gid == *gid)).map(|i| i as u8 + 1)
    }

    pub(crate) fn has_lid(&self, lid: u16) -> Option<u8> {
        if lid == 0 {
            return None;
        }
        self.ports.iter().position(|p| p.attr.lock().lid == lid).map(|i| i as u8 + 1)
    }
}

/// An emulated RDMA device on a fabric (`struct ibv_device`).
#[derive(Clone, Debug)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
    pub(crate) fabric: Arc<FabricInner>,
}

impl Device {
    /// The fabric the device is on.
    pub fn fabric(&self) -> crate::Fabric {
        crate::Fabric(self.fabric.clone())
    }

    /// Kernel-style name, `emu0`, `emu1`, ...
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Index of the device on its fabric.
    pub fn index(&self) -> u32 {
        self.inner.id.index
    }

    /// Node GUID in host byte order.
    pub fn guid(&self) -> u64 {
        self.inner.attr.node_guid
    }

    /// The profile this device reports.
    pub fn profile(&self) -> Profile {
        self.inner.profile
    }

    /// `ibv_query_device`.
    pub fn attr(&self) -> &DeviceAttr {
        &self.inner.attr
    }

    /// `ibv_query_port`.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        Ok(self.inner.port(port)?.attr.lock().clone())
    }

    /// `ibv_query_gid`: an index inside the table that holds no GID reads as zero.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        Ok(self.query_gid_entry(port, index)?.map_or(Gid::ZERO, |e| e.gid))
    }

    /// `ibv_query_gid_ex`: `Ok(None)` for an index inside the table that holds no GID.
    pub fn query_gid_entry(&self, port: u8, index: u32) -> Result<Option<GidEntry>> {
        let p = self.inner.port(port)?;
        if index >= p.attr.lock().gid_tbl_len {
            return Err(einval("GID index beyond the table"));
        }
        Ok(p.gids.iter().find(|e| e.index == index).copied())
    }

    /// The populated GID entries of `port` (`ibv_query_gid_table`).
    pub fn gid_table(&self, port: u8) -> Result<Vec<GidEntry>> {
        Ok(self.inner.port(port)?.gids.clone())
    }

    /// `ibv_query_pkey`.
    pub fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        let p = self.inner.port(port)?;
        if index >= p.attr.lock().pkey_tbl_len {
            return Err(einval("P_Key index beyond the table"));
        }
        Ok(p.pkeys.get(index as usize).copied().unwrap_or(0))
    }

    /// `ibv_open_device`.
    pub fn open(&self) -> Result<Context> {
        Context::open(self)
    }

    /// Takes port `port` down (`PortState::DOWN`) or brings it back (`PortState::ACTIVE`), as a
    /// cable pull would: every open context of the device gets `IBV_EVENT_PORT_ERR` or
    /// `IBV_EVENT_PORT_ACTIVE`, and while the port is down every packet to or from it is lost
    /// (RC retries and then fails with `RETRY_EXC_ERR`; UC and UD lose the message).
    pub fn set_port_state(&self, port: u8, state: crate::PortState) -> Result<()> {
        use crate::{EventType, PortState};
        let p = self.inner.port(port)?;
        let (up, event, phys) = match state {
            PortState::ACTIVE => (true, EventType::PORT_ACTIVE, 5),
            PortState::DOWN => (false, EventType::PORT_ERR, 3),
            _ => return Err(einval("a port can be set ACTIVE or DOWN")),
        };
        {
            let mut a = p.attr.lock();
            if a.state == state {
                return Ok(());
            }
            a.state = state;
            a.phys_state = phys;
            // Under the lock, so that the fabric's count of ports down follows the flags.
            p.up.store(up, std::sync::atomic::Ordering::Release);
            self.fabric.detours.port_went(!up);
        }
        if let Some(watch) = self.fabric.port_watch.get() {
            (watch.0)(self, port);
        }
        self.raise_event(event, Some(port))
    }

    /// Raises a port event (`LID_CHANGE`, `PKEY_CHANGE`, `GID_CHANGE`, `SM_CHANGE`,
    /// `CLIENT_REREGISTER`, `PORT_ACTIVE`, `PORT_ERR`, with `Some(port)`) or `DEVICE_FATAL`
    /// (with `None`) on every open context of the device, so that handlers can be tested.
    /// Events that traffic raises (QP, CQ, SRQ events) are refused with `EINVAL`.
    pub fn raise_event(&self, event_type: crate::EventType, port: Option<u8>) -> Result<()> {
        use crate::EventType as E;
        let port = match (event_type, port) {
            (
                E::PORT_ACTIVE
                | E::PORT_ERR
                | E::LID_CHANGE
                | E::PKEY_CHANGE
                | E::GID_CHANGE
                | E::SM_CHANGE
                | E::CLIENT_REREGISTER,
                Some(p),
            ) => {
                self.inner.port(p)?;
                Some(p)
            }
            (E::DEVICE_FATAL, None) => None,
            _ => return Err(einval("not a port or device event (or the port is missing)")),
        };
        let mut ctxs = self.inner.contexts.lock();
        ctxs.retain(|w| w.strong_count() > 0);
        for c in ctxs.iter().filter_map(std::sync::Weak::upgrade) {
            let about = port.map_or(super::context::About::Device, super::context::About::Port);
            c.raise(event_type, about);
        }
        Ok(())
    }

    /// Whether port `port` is up (packets pass).
    pub(crate) fn port_up(inner: &DeviceInner, port: u8) -> bool {
        inner.port(port).map(|p| p.up.load(std::sync::atomic::Ordering::Acquire)).unwrap_or(false)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn test_resource_counts_refuse_past_the_limit_with_enomem() {
        let c = AtomicU32::new(0);
        ResourceCounts::take(&c, 2, "x").unwrap();
        ResourceCounts::take(&c, 2, "x").unwrap();
        assert_eq!(ResourceCounts::take(&c, 2, "x").unwrap_err().errno(), Errno::ENOMEM);
        ResourceCounts::give(&c);
        ResourceCounts::take(&c, 2, "x").unwrap();
    }

    #[test]
    fn test_opening_and_closing_contexts_does_not_grow_the_device() {
        let f = crate::Fabric::new(crate::FabricConfig { devices: 1, ..Default::default() });
        let dev = &f.devices()[0];
        let kept = dev.open().unwrap();
        for _ in 0..10_000 {
            dev.open().unwrap().close();
        }
        let listed = dev.inner.contexts.lock().len();
        assert!(listed <= 8, "{listed} listed: closed contexts are dropped from the list");
        let live = dev.inner.contexts.lock().iter().filter(|w| w.strong_count() > 0).count();
        assert_eq!(live, 1);
        drop(kept);
    }
}
