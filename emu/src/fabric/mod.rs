//! The fabric: devices that can reach each other, routing by GID or LID plus QPN.
//!
//! The in-process fabric is a pure router: it never buffers, reorders or drops on its own. A
//! packet is handed to the destination QP's inbox, and the driver (see `engine`) services that
//! QP. Lookups are by key only; nothing depends on map iteration order.

pub(crate) mod timer;

use std::{
    collections::HashMap,
    sync::{Arc, Weak},
};

use parking_lot::{Mutex, RwLock};

use crate::{
    objects::device::{Device, DeviceInner},
    profile::Profile,
    qp::QpShared,
    types::AhAttr,
};

/// How to build a fabric.
#[derive(Debug, Clone)]
pub struct FabricConfig {
    /// Number of devices (each with one port).
    pub devices: u32,
    /// What the devices report.
    pub profile: Profile,
    /// Ports per device (1 to 4; the rxe profile always has 1, as rxe).
    pub ports: u8,
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig { devices: 2, profile: Profile::Full, ports: 1 }
    }
}

/// First QPN handed out (0 and 1 are the special QPs; rxe starts at 0x11).
const FIRST_QPN: u32 = 0x11;
const MAX_QPN: u32 = 0x00ff_ffff;

#[derive(Debug)]
pub(crate) struct FabricInner {
    pub(crate) devices: Vec<Arc<DeviceInner>>,
    qps: RwLock<HashMap<u32, Weak<QpShared>>>,
    next_qpn: Mutex<u32>,
    pub(crate) timer: timer::Timer,
}

impl FabricInner {
    /// Registers a QP and returns its fabric-wide unique number (next-fit, as rxe's index
    /// allocator: numbers are not reused until the space wraps).
    pub(crate) fn register_qp(
        &self,
        make: impl FnOnce(u32) -> Arc<QpShared>,
    ) -> Option<Arc<QpShared>> {
        let mut qps = self.qps.write();
        let mut next = self.next_qpn.lock();
        for _ in 0..=(MAX_QPN - FIRST_QPN) {
            let qpn = *next;
            *next = if qpn >= MAX_QPN { FIRST_QPN } else { qpn + 1 };
            if let std::collections::hash_map::Entry::Vacant(slot) = qps.entry(qpn) {
                let qp = make(qpn);
                slot.insert(Arc::downgrade(&qp));
                return Some(qp);
            }
        }
        None
    }

    pub(crate) fn unregister_qp(&self, qpn: u32) {
        self.qps.write().remove(&qpn);
    }

    /// The live QP numbered `qpn` on device `dev`.
    pub(crate) fn lookup_qp(&self, dev: u32, qpn: u32) -> Option<Arc<QpShared>> {
        let qp = self.qps.read().get(&qpn)?.upgrade()?;
        (qp.device_index() == dev).then_some(qp)
    }

    /// The device and port an address vector leads to: by GID when it carries a GRH, else by
    /// LID.
    pub(crate) fn route(&self, ah: &AhAttr) -> Option<(u32, u8)> {
        self.devices.iter().find_map(|d| {
            let port = if ah.is_global { d.has_gid(&ah.dgid) } else { d.has_lid(ah.dlid) };
            port.map(|p| (d.id.index, p))
        })
    }

    /// Nanoseconds since the fabric started (the real-time drivers' clock).
    pub(crate) fn now(&self) -> u64 {
        self.timer.now()
    }
}

/// A set of emulated devices that can talk to each other, in this process.
///
/// Every device, context and object created from it shares one network; two fabrics never
/// see each other.
#[derive(Clone, Debug)]
pub struct Fabric(pub(crate) Arc<FabricInner>);

impl Fabric {
    /// A fabric with `cfg.devices` devices named `emu0`, `emu1`, ...
    pub fn new(cfg: FabricConfig) -> Fabric {
        let devices = (0..cfg.devices)
            .map(|i| Arc::new(DeviceInner::new(i, cfg.profile, cfg.ports)))
            .collect();
        Fabric(Arc::new(FabricInner {
            devices,
            qps: RwLock::new(HashMap::new()),
            next_qpn: Mutex::new(FIRST_QPN),
            timer: timer::Timer::new(),
        }))
    }

    /// `ibv_get_device_list`.
    pub fn devices(&self) -> Vec<Device> {
        self.0.devices.iter().map(|d| Device { inner: d.clone(), fabric: self.0.clone() }).collect()
    }

    /// The device called `name`.
    pub fn device(&self, name: &str) -> Option<Device> {
        self.devices().into_iter().find(|d| d.name() == name)
    }
}
