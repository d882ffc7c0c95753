//! Address handles (`struct ibv_ah`): where a UD send goes.

use std::sync::Arc;

use super::{
    Lifecycle,
    device::ResourceCounts,
    pd::{Pd, PdInner},
};
use crate::{
    error::{Errno, Error, Result, einval},
    types::{AhAttr, LinkLayer},
};

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
        ResourceCounts::take(&dev.counts.ah, dev.attr.max_ah, "too many address handles")?;
        if let Err(e) = pd.0.life.get() {
            ResourceCounts::give(&dev.counts.ah);
            return Err(e);
        }
        let dest = pd.0.ctx.fabric.route(attr);
        Ok(Ah(Arc::new(AhInner {
            pd: pd.0.clone(),
            attr: *attr,
            dest,
            life: Lifecycle::default(),
        })))
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
