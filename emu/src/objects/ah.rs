//! Address handles (`struct ibv_ah`): where a UD send goes.

use std::sync::Arc;

use super::{
    Lifecycle,
    device::{PortInner, ResourceCounts},
    pd::{Pd, PdInner},
};
use crate::{
    error::{Errno, Error, Result, einval},
    fabric::FabricInner,
    types::{AhAttr, Gid, GidType, LinkLayer},
};

/// The hop limit the kernel's route lookup gives a resolved unicast RoCE path, replacing the
/// one asked for (IPv4's default TTL and IPv6's default hop limit).
const ROUTE_HOP_LIMIT: u8 = 64;

/// Resolves a RoCE address vector as the kernel does when an AH is created or a QP given a
/// path (`ib_resolve_eth_dmac`): a multicast GID maps to its MAC; a link-local GID from a RoCE
/// v1 source needs no lookup; otherwise the source and destination must be of one IP family
/// (`EINVAL`) and a port on the fabric must own the destination, else neighbour resolution
/// fails (`ETIMEDOUT`; the kernel gives up after a second, the emulator at once). A resolved
/// route sets the hop limit to the route's (rxe sends IPv4 with TTL 64 whatever the AH says).
pub(crate) fn resolve_roce(
    fabric: &FabricInner,
    port: &PortInner,
    attr: &mut AhAttr,
) -> Result<()> {
    let d = &attr.dgid;
    if d.is_multicast() {
        return Ok(());
    }
    let Some(sgid) = port.gids.iter().find(|e| e.index == attr.sgid_index as u32) else {
        return Err(einval("sgid_index names no GID"));
    };
    let link_local = d.0[..8] == [0xfe, 0x80, 0, 0, 0, 0, 0, 0];
    if link_local && sgid.gid_type == GidType::ROCE_V1 {
        return Ok(());
    }
    if d.ipv4().is_some() != sgid.gid.ipv4().is_some() {
        return Err(einval("the source and destination GIDs are of different IP families"));
    }
    if fabric.route(attr).is_none() {
        return Err(Error::new(Errno::ETIMEDOUT, "no port on the fabric has the destination GID"));
    }
    attr.hop_limit = ROUTE_HOP_LIMIT;
    Ok(())
}

/// The Ethernet address a RoCE destination resolves to, as libibverbs' neighbour lookup
/// (`ibv_resolve_eth_l2_from_gid`) finds it from source port `port`: a multicast GID's
/// mapped MAC (`01:00:5e` + 23 bits for IPv4, `33:33` + 32 bits for IPv6), else the MAC of the
/// device that owns the GID. `EINVAL` on an InfiniBand port (no netdev to route on), for a
/// GID index with no GID or GIDs of different IP families; `EHOSTUNREACH` when no port owns
/// the destination.
pub(crate) fn resolve_eth_l2(
    fabric: &FabricInner,
    port: &PortInner,
    attr: &AhAttr,
) -> Result<[u8; 6]> {
    if port.attr.lock().link_layer != LinkLayer::ETHERNET {
        return Err(einval("an InfiniBand port has no Ethernet neighbours"));
    }
    let Some(sgid) = port.gids.iter().find(|e| e.index == attr.sgid_index as u32) else {
        return Err(einval("sgid_index names no GID"));
    };
    if attr.dgid.is_multicast() {
        // The group's MAC: 01:00:5e and the low 23 bits of an IPv4 group, 33:33 and the low
        // 32 bits of an IPv6 one.
        let d = &attr.dgid.0;
        return Ok(match attr.dgid.ipv4() {
            Some(ip) => [1, 0, 0x5e, ip[1] & 0x7f, ip[2], ip[3]],
            None => [0x33, 0x33, d[12], d[13], d[14], d[15]],
        });
    }
    if Gid::ipv4(&attr.dgid).is_some() != Gid::ipv4(&sgid.gid).is_some() {
        return Err(einval("the source and destination GIDs are of different IP families"));
    }
    let dest = fabric.route(attr);
    if dest.is_some_and(|(dev, _)| dev == crate::types::WIRE_DEV) {
        // Beyond a wire port the kernel resolves the neighbour as it sends; the MAC reported
        // is the one the GID names.
        return Ok(attr.dgid.mac());
    }
    let owner = dest.and_then(|(dev, _)| fabric.devices.get(dev as usize));
    owner.map(|d| d.id.mac).ok_or(Error::new(Errno::EHOSTUNREACH, "no neighbour has that GID"))
}

#[derive(Debug)]
pub(crate) struct AhInner {
    pub(crate) pd: Arc<PdInner>,
    pub(crate) attr: AhAttr,
    /// The device and port the address leads to (None: nobody has that address).
    pub(crate) dest: Option<(u32, u8)>,
    life: Lifecycle,
}

impl Drop for AhInner {
    fn drop(&mut self) {
        if self.life.destroy().is_ok() {
            self.pd.life.put();
            ResourceCounts::give(&self.pd.ctx.device.counts.ah);
        }
    }
}

/// An address handle.
#[derive(Clone, Debug)]
pub struct Ah(pub(crate) Arc<AhInner>);

impl Ah {
    pub(crate) fn create(pd: &Pd, attr: &AhAttr) -> Result<Ah> {
        let dev = &pd.0.ctx.device;
        let port = dev.port(attr.port_num)?;
        let pattr = port.attr.lock().clone();
        if pattr.link_layer == LinkLayer::ETHERNET && !attr.is_global {
            return Err(einval("RoCE address handles need a GRH"));
        }
        if attr.is_global && !port.gids.iter().any(|e| e.index == attr.sgid_index as u32) {
            return Err(einval("sgid_index names no GID"));
        }
        if !attr.is_global && attr.dlid == 0 {
            return Err(einval("a LID-routed address needs a DLID"));
        }
        let mut attr = *attr;
        if pattr.link_layer == LinkLayer::ETHERNET {
            resolve_roce(&pd.0.ctx.fabric, port, &mut attr)?;
        }
        ResourceCounts::take(&dev.counts.ah, dev.attr.max_ah, "too many address handles")?;
        if let Err(e) = pd.0.life.get() {
            ResourceCounts::give(&dev.counts.ah);
            return Err(e);
        }
        let dest = pd.0.ctx.fabric.route(&attr);
        Ok(Ah(Arc::new(AhInner { pd: pd.0.clone(), attr, dest, life: Lifecycle::default() })))
    }

    /// The address this handle was created with.
    pub fn attr(&self) -> AhAttr {
        self.0.attr
    }

    /// `ibv_destroy_ah`.
    pub fn destroy(&self) -> Result<()> {
        self.0.life.destroy().map_err(|e| {
            if e.errno() == Errno::EBUSY {
                Error::new(Errno::EBUSY, "address handle in use")
            } else {
                e
            }
        })?;
        self.0.pd.life.put();
        ResourceCounts::give(&self.0.pd.ctx.device.counts.ah);
        Ok(())
    }

    pub(crate) fn check(&self) -> Result<()> {
        self.0.life.check()
    }
}
