//! Local scatter/gather lists and the engine's payloads: a request's SGEs resolved against the
//! QP's MRs (lkey, PD, access, bounds) into a payload, and payloads moved into a receive's
//! SGEs (the scatter itself, for any source, is `objects::sgl`'s).

// The scatter into a receive's SGEs is the objects' (any source; payloads below).
pub(crate) use crate::objects::sgl::{SglError, scatter};
use crate::packet::{MemRef, Payload, Piece};
use crate::{
    mem::MemRegion,
    objects::sgl::Source,
    qp::QpShared,
    types::{AccessFlags, Sge},
};

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

// The engine's payloads, copied into a receive as bytes at hand are.
impl Source for Payload {
    fn copy_into<'a>(
        &self,
        dst: impl Iterator<Item = (&'a std::sync::Arc<MemRegion>, usize, usize)>,
    ) -> Result<(), crate::mem::MemFault> {
        copy_into(self, dst)
    }
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
