//! XRC domains (`ibv_open_xrcd`): the scope in which XRC target QPs find the XRC SRQs named by
//! incoming requests (IBA 11.2.6.1, Annex A14).
//!
//! Opening the same file (its inode) again yields the same domain, as the kernel's per-device
//! inode table does; a domain opened without a file is private. Two processes of a host fabric
//! that open one file each hold a domain object, and the two act as one: a target QP in one
//! process delivers SENDs into the other's SRQs of the domain (see `engine::xrc`).

use std::{
    collections::HashMap,
    sync::{
        Arc, Weak,
        atomic::{AtomicU32, Ordering},
    },
};

use crate::sync::Mutex;

use super::{
    Lifecycle,
    context::{Context, ContextInner},
    cq::Cq,
    pd::Pd,
    srq::{Srq, SrqAttr, SrqInner},
};
use crate::error::{Errno, Error, Result, einval};

/// `O_CREAT` / `O_EXCL` of `struct ibv_xrcd_init_attr`'s `oflags` (Linux values).
pub mod xrcd_oflags {
    pub const CREAT: i32 = 0o100;
    pub const EXCL: i32 = 0o200;
}

/// A file's identity: (device, inode).
pub type FileId = (u64, u64);

#[derive(Debug)]
pub(crate) struct XrcdInner {
    pub(crate) ctx: Arc<ContextInner>,
    pub(crate) file: Option<FileId>,
    /// A target QP has no PD and no CQs; it holds these placeholders, which no request ever
    /// reaches (requests use the PD and CQ of the SRQ they name).
    pub(crate) holder_pd: Pd,
    pub(crate) holder_cq: Cq,
    /// Dependents: XRC SRQs and target QPs.
    pub(crate) life: Lifecycle,
    /// How many opens share the domain.
    opens: AtomicU32,
    srqs: Mutex<HashMap<u32, Weak<SrqInner>>>,
}

impl XrcdInner {
    /// The XRC SRQ numbered `srqn` in this domain.
    pub(crate) fn srq(&self, srqn: u32) -> Option<Arc<SrqInner>> {
        self.srqs.lock().get(&srqn)?.upgrade().filter(|s| s.life.is_alive())
    }

    pub(crate) fn forget_srq(&self, srqn: u32) {
        self.srqs.lock().remove(&srqn);
    }
}

/// An XRC domain (`struct ibv_xrcd`).
#[derive(Clone, Debug)]
pub struct Xrcd(pub(crate) Arc<XrcdInner>);

impl Xrcd {
    /// `ibv_open_xrcd`: `file` is the (device, inode) of the file behind `fd`, or `None` for
    /// `fd == -1` (a private domain). With a file: an existing domain is shared unless
    /// `O_EXCL` is given (`EINVAL`); a missing one is made only with `O_CREAT` (`EAGAIN`).
    pub(crate) fn open(ctx: &Context, file: Option<FileId>, oflags: i32) -> Result<Xrcd> {
        let dev = &ctx.0.device;
        if !dev.attr.has_xrc() {
            return Err(Error::new(Errno::EOPNOTSUPP, "the device has no XRC"));
        }
        let mut table = dev.xrcds.lock();
        table.retain(|(_, w)| w.strong_count() > 0);
        if let Some(id) = file
            && let Some(x) = table.iter().find(|(f, _)| *f == id).and_then(|(_, w)| w.upgrade())
        {
            if oflags & xrcd_oflags::EXCL != 0 {
                return Err(einval("the XRC domain exists and O_EXCL was given"));
            }
            x.opens.fetch_add(1, Ordering::AcqRel);
            return Ok(Xrcd(x));
        }
        if file.is_some() && oflags & xrcd_oflags::CREAT == 0 {
            return Err(Error::new(Errno::EAGAIN, "no XRC domain for the file and no O_CREAT"));
        }
        let inner = Arc::new(XrcdInner {
            ctx: ctx.0.clone(),
            file,
            holder_pd: ctx.alloc_pd()?,
            holder_cq: ctx.create_cq(1, None, 0)?,
            life: Lifecycle::default(),
            opens: AtomicU32::new(1),
            srqs: Mutex::new(HashMap::new()),
        });
        if let Some(id) = file {
            table.push((id, Arc::downgrade(&inner)));
        }
        Ok(Xrcd(inner))
    }

    /// `ibv_close_xrcd`: `EBUSY` while SRQs or target QPs use the domain; the domain itself
    /// goes with its last open.
    pub fn close(&self) -> Result<()> {
        let x = &self.0;
        x.life.check()?;
        if x.opens.load(Ordering::Acquire) > 1 {
            x.opens.fetch_sub(1, Ordering::AcqRel);
            return Ok(());
        }
        x.life.destroy()?;
        if let Some(id) = x.file {
            x.ctx.device.xrcds.lock().retain(|(f, w)| *f != id && w.strong_count() > 0);
        }
        Ok(())
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC`: an SRQ of `pd` in this domain whose receive
    /// completions go to `cq`.
    pub fn create_srq(&self, pd: &Pd, cq: &Cq, attr: &SrqAttr) -> Result<Srq> {
        let x = &self.0;
        if !Arc::ptr_eq(&pd.0.ctx.device, &x.ctx.device)
            || !Arc::ptr_eq(&cq.0.ctx.device, &x.ctx.device)
        {
            return Err(einval("PD or CQ of another device"));
        }
        x.life.get()?;
        if let Err(e) = cq.0.life.get() {
            x.life.put();
            return Err(e);
        }
        match Srq::create_in(pd, attr, Some((x.clone(), cq.0.clone()))) {
            Ok(srq) => {
                x.srqs.lock().insert(srq.0.num, Arc::downgrade(&srq.0));
                Ok(srq)
            }
            Err(e) => {
                cq.0.life.put();
                x.life.put();
                Err(e)
            }
        }
    }

    /// Whether two handles name the same domain.
    pub fn same(&self, other: &Xrcd) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
