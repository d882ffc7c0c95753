//! Local scatter/gather lists: resolving SGEs against the QP's MRs (lkey, PD, access, bounds)
//! and moving payloads into them.

use super::packet::{MemRef, Payload, Piece};
use crate::{
    mem::MemRegion,
    qp::QpShared,
    types::{AccessFlags, Sge},
};

/// Why a local SGE list could not be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SglError {
    /// An lkey that names no MR of the QP's PD, lacks the access, or a range outside the MR.
    Protection,
    /// The payload is longer than the SGEs can hold.
    TooLong,
}

/// Resolves a local SGE list into memory ranges: the source of a SEND/WRITE, or (with
/// `LOCAL_WRITE` required) the destination of a READ, which the responder fills directly.
pub(crate) fn resolve(qp: &QpShared, sges: &[Sge], need_write: bool) -> Result<Payload, SglError> {
    let keys = qp.ctx.device.keys.read();
    let mut out = Payload::None;
    for sge in sges.iter().filter(|s| s.length > 0) {
        let mr = keys.mr(sge.lkey).ok_or(SglError::Protection)?;
        if !std::sync::Arc::ptr_eq(&mr.pd, &qp.pd)
            || (need_write && !mr.access.contains(AccessFlags::LOCAL_WRITE))
        {
            return Err(SglError::Protection);
        }
        let offset = mr.offset_of(sge.addr, sge.length as u64).ok_or(SglError::Protection)?;
        let m = MemRef { region: mr.region.clone(), offset, len: sge.length as usize };
        // The common single-SGE case allocates nothing.
        out = match out {
            Payload::None => Payload::One(m),
            Payload::One(first) => Payload::Gather(vec![first, m]),
            Payload::Gather(mut v) => {
                v.push(m);
                Payload::Gather(v)
            }
            Payload::Bytes(_)
            | Payload::Lent(_)
            | Payload::Remote
            | Payload::Placed(_)
            | Payload::Landed(_)
            | Payload::Peer(_) => {
                unreachable!("resolve builds neither")
            }
        };
    }
    Ok(out)
}

/// Copies `payload` (of `len` bytes) into the local SGEs, which need `LOCAL_WRITE` and must be
/// in `pd` (the QP's, or for an XRC target the SRQ's).
pub(crate) fn scatter(
    pd: &std::sync::Arc<crate::objects::pd::PdInner>,
    sges: &[Sge],
    payload: &Payload,
    len: u32,
) -> Result<(), SglError> {
    scatter_from(pd, sges, payload, len)
}

/// [`scatter`] of bytes at hand.
pub(crate) fn scatter_bytes(
    pd: &std::sync::Arc<crate::objects::pd::PdInner>,
    sges: &[Sge],
    bytes: &[u8],
) -> Result<(), SglError> {
    scatter_from(pd, sges, bytes, bytes.len() as u32)
}

/// What [`scatter`] copies from.
trait Source {
    /// Copies it into consecutive destination ranges `(region, offset, len)`.
    fn copy_into<'a>(
        &self,
        dst: impl Iterator<Item = (&'a std::sync::Arc<MemRegion>, usize, usize)>,
    ) -> Result<(), crate::mem::MemFault>;
}

impl Source for Payload {
    fn copy_into<'a>(
        &self,
        dst: impl Iterator<Item = (&'a std::sync::Arc<MemRegion>, usize, usize)>,
    ) -> Result<(), crate::mem::MemFault> {
        copy_into(self, dst)
    }
}

impl Source for [u8] {
    fn copy_into<'a>(
        &self,
        dst: impl Iterator<Item = (&'a std::sync::Arc<MemRegion>, usize, usize)>,
    ) -> Result<(), crate::mem::MemFault> {
        let mut done = 0;
        for (region, off, n) in dst {
            let n = n.min(self.len() - done);
            region.write(off, &self[done..done + n])?;
            done += n;
        }
        Ok(())
    }
}

fn scatter_from<S: Source + ?Sized>(
    pd: &std::sync::Arc<crate::objects::pd::PdInner>,
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
        let writable =
            std::sync::Arc::ptr_eq(&mr.pd, pd) && mr.access.contains(AccessFlags::LOCAL_WRITE);
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

/// Copies the first `out.len()` bytes of `payload` into `out`; how many there were.
pub(crate) fn gather(payload: &Payload, out: &mut [u8]) -> Result<usize, crate::mem::MemFault> {
    let mut done = 0;
    for piece in payload.pieces() {
        let n = piece.len().min(out.len() - done);
        piece.read(0, &mut out[done..done + n])?;
        done += n;
        if done == out.len() {
            break;
        }
    }
    Ok(done)
}

/// Copies `payload` into consecutive destination ranges `(region, offset, len)`.
pub(crate) fn copy_into<'a>(
    payload: &Payload,
    mut dst: impl Iterator<Item = (&'a std::sync::Arc<MemRegion>, usize, usize)>,
) -> Result<(), crate::mem::MemFault> {
    let mut cur = dst.next();
    for piece in payload.pieces() {
        let mut done = 0usize;
        while done < piece.len() {
            let Some((region, off, room)) = cur else {
                return Ok(());
            };
            let n = room.min(piece.len() - done);
            match piece {
                Piece::Bytes(b) => region.write(off, &b[done..done + n])?,
                Piece::Mem(m) => MemRegion::copy(&m.region, m.offset + done, region, off, n)?,
                Piece::Peer(p) => region.pull(off, p, done, n)?,
            }
            done += n;
            cur = if n == room { dst.next() } else { Some((region, off + n, room - n)) };
        }
    }
    Ok(())
}
