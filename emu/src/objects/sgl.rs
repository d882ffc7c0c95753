//! Local scatter lists: the SGEs of a receive (or a READ's destination) resolved against the
//! MRs of its PD (lkey, PD, `LOCAL_WRITE`, bounds) and filled, from bytes at hand or from
//! whatever else implements [`Source`] (the engine's packet payloads); and a frame landed in a
//! receive's buffers as the receive offloads shape it (a WQ's, or a raw packet QP's own).

use std::sync::Arc;

use super::pd::PdInner;
use crate::{
    frame::{self, Headers},
    mem::{MemFault, MemRegion},
    types::{AccessFlags, Sge, Wc, WcFlags, WcStatus, WqFlags},
};

/// Why a local SGE list could not be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SglError {
    /// An lkey that names no MR of the QP's PD, lacks the access, or a range outside the MR.
    Protection,
    /// The payload is longer than the SGEs can hold.
    TooLong,
}

/// What [`scatter`] copies from.
pub(crate) trait Source {
    /// Copies it into consecutive destination ranges `(region, offset, len)`.
    fn copy_into<'a>(
        &self,
        dst: impl Iterator<Item = (&'a Arc<MemRegion>, usize, usize)>,
    ) -> Result<(), MemFault>;
}

impl Source for [u8] {
    fn copy_into<'a>(
        &self,
        dst: impl Iterator<Item = (&'a Arc<MemRegion>, usize, usize)>,
    ) -> Result<(), MemFault> {
        let mut done = 0;
        for (region, off, n) in dst {
            let n = n.min(self.len() - done);
            region.write(off, &self[done..done + n])?;
            done += n;
        }
        Ok(())
    }
}

/// Copies `src` (of `len` bytes) into the local SGEs `sges`, which need `LOCAL_WRITE` and must
/// be in `pd`: nothing is written if one the data reaches is not.
pub(crate) fn scatter<S: Source + ?Sized>(
    pd: &Arc<PdInner>,
    sges: &[Sge],
    payload: &S,
    len: u32,
) -> Result<(), SglError> {
    let room: u64 = sges.iter().map(|s| s.length as u64).sum();
    if len as u64 > room {
        return Err(SglError::TooLong);
    }
    let keys = pd.ctx.device.keys.read();
    // The SGEs the data reaches, each with how much of it lands there.
    let reached = || {
        let mut left = len as u64;
        sges.iter().filter(|s| s.length > 0).map_while(move |sge| {
            let take = left.min(sge.length as u64);
            left -= take;
            (take > 0).then_some((sge, take as usize))
        })
    };
    let target = |sge: &Sge| {
        let mr = keys.mr(sge.lkey)?;
        let writable = Arc::ptr_eq(&mr.pd, pd) && mr.access.contains(AccessFlags::LOCAL_WRITE);
        let off = mr.offset_of(sge.addr, sge.length as u64).filter(|_| writable)?;
        Some((&mr.region, off))
    };
    // The common receive: one SGE that holds it all.
    if let [sge] = sges {
        if len == 0 {
            return Ok(());
        }
        let (region, off) = target(sge).ok_or(SglError::Protection)?;
        let dst = std::iter::once((region, off, len as usize));
        return payload.copy_into(dst).map_err(|_| SglError::Protection);
    }
    // Every SGE that receives data is checked before anything is copied, so a bad SGE writes
    // nothing; then they are looked up again rather than remembered (no allocation).
    if !reached().all(|(sge, _)| target(sge).is_some()) {
        return Err(SglError::Protection);
    }
    let dst = reached().filter_map(|(sge, take)| target(sge).map(|(r, off)| (r, off, take)));
    payload.copy_into(dst).map_err(|_| SglError::Protection)
}

/// What the completion of a receive that took a frame reports.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Landed {
    byte_len: u32,
    cvlan: u16,
    flags: WcFlags,
}

impl Landed {
    /// `base` (a successful receive completion) with what the frame gave it.
    pub(crate) fn wc(self, base: Wc) -> Wc {
        Wc {
            byte_len: self.byte_len,
            cvlan: self.cvlan,
            wc_flags: base.wc_flags | self.flags,
            ..base
        }
    }
}

/// Writes the received frame `f` into the receive buffers `sges` (which must be in `pd`) as the
/// receive offloads `rx` shape it: the C-VLAN tag taken out, the FCS written after the frame,
/// the last cache line filled with zeros. The status of a receive that cannot take it.
pub(crate) fn land(
    rx: WqFlags,
    pd: &Arc<PdInner>,
    sges: &[Sge],
    f: &[u8],
) -> Result<Landed, WcStatus> {
    let mut flags = WcFlags::empty();
    if Headers::parse(f).is_some_and(|h| frame::ipv4_checksums_ok(f, &h)) {
        flags |= WcFlags::IP_CSUM_OK;
    }
    let stripped = if rx.contains(WqFlags::CVLAN_STRIPPING) { frame::strip_cvlan(f) } else { None };
    let (mut bytes, cvlan) = stripped.unwrap_or_else(|| (f.to_vec(), 0));
    if rx.contains(WqFlags::SCATTER_FCS) {
        // The FCS covers the frame as the wire carried it, tag included.
        bytes.extend_from_slice(&frame::fcs(f));
    }
    let byte_len = bytes.len() as u32;
    if rx.contains(WqFlags::PCI_WRITE_END_PADDING) {
        bytes.resize(bytes.len() + end_padding(sges, bytes.len() as u64), 0);
    }
    let n = bytes.len() as u32;
    scatter(pd, sges, &bytes[..], n).map_err(|e| match e {
        SglError::TooLong => WcStatus::LOC_LEN_ERR,
        SglError::Protection => WcStatus::LOC_PROT_ERR,
    })?;
    Ok(Landed { byte_len, cvlan, flags })
}

/// The cache line the end padding fills.
const CACHE_LINE: u64 = 64;

/// How many bytes after the first `len` of the buffers `sges` complete the cache line the last
/// byte lands in (within that SGE: padding never writes where the receive does not point).
fn end_padding(sges: &[Sge], len: u64) -> usize {
    let mut left = len;
    for s in sges.iter().filter(|s| s.length > 0) {
        let room = u64::from(s.length);
        if left <= room {
            let end = s.addr.wrapping_add(left);
            let pad = end.checked_next_multiple_of(CACHE_LINE).map_or(0, |e| e - end);
            return pad.min(room - left) as usize;
        }
        left -= room;
    }
    0
}
