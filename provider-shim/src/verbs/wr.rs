//! The `ibv_wr_*` work-request API of `ibv_qp_ex`: WRs are built between `wr_start` and
//! `wr_complete` (which posts them) or `wr_abort` (which drops them).

use core::ffi::{c_int, c_void};

use rdma_emu::{MwBind, SendFlags, SendWr, Sge, WrOpcode};

use crate::{abi::*, boundary::ffi, objects::*};

/// One WR under construction.
#[derive(Default)]
pub(crate) struct Pending {
    wr_id: u64,
    opcode: WrOpcode,
    flags: u32,
    remote_addr: u64,
    rkey: u32,
    compare_add: u64,
    swap: u64,
    imm: u32,
    sges: Vec<Sge>,
    inline: Option<Vec<u8>>,
    /// `wr_bind_mw`: the window, its new rkey and the bind info, resolved at `wr_complete`,
    /// and the window's rkey as the application held it at the call.
    bind: Option<(*mut ibv_mw, u32, ibv_mw_bind_info, u32)>,
    /// `wr_local_inv` / `wr_send_inv`.
    invalidate_rkey: u32,
    /// `wr_set_xrc_srqn`.
    xrc_srqn: u32,
    /// `wr_set_ud_addr`: address handle, remote QPN and Q_Key, resolved at `wr_complete`.
    ud: Option<(*mut ibv_ah, u32, u32)>,
    /// `wr_send_tso`: the header (copied) and the segment size.
    tso: Option<(Vec<u8>, u16)>,
    /// `wr_flush`: length, placement type and selectivity level.
    flush: Option<rdma_emu::Flush>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").field("wr_id", &self.wr_id).field("opcode", &self.opcode).finish()
    }
}

/// The batch of a QP between `wr_start` and `wr_complete`.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    wrs: Vec<Pending>,
    /// First error met while building (`wr_complete` returns it and posts nothing).
    err: c_int,
}

/// Fills the `wr_*` slots of a new extended QP.
pub(crate) fn fill(q: &mut ibv_qp_ex) {
    q.wr_start = Some(wr_start);
    q.wr_complete = Some(wr_complete);
    q.wr_abort = Some(wr_abort);
    q.wr_rdma_write = Some(wr_rdma_write);
    q.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    q.wr_send = Some(wr_send);
    q.wr_send_imm = Some(wr_send_imm);
    q.wr_rdma_read = Some(wr_rdma_read);
    q.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    q.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    q.wr_set_sge = Some(wr_set_sge);
    q.wr_set_sge_list = Some(wr_set_sge_list);
    q.wr_set_inline_data = Some(wr_set_inline_data);
    q.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    q.wr_bind_mw = Some(wr_bind_mw);
    q.wr_local_inv = Some(wr_local_inv);
    q.wr_send_inv = Some(wr_send_inv);
    q.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
    q.wr_set_ud_addr = Some(wr_set_ud_addr);
    q.wr_atomic_write = Some(wr_atomic_write);
    q.wr_send_tso = Some(wr_send_tso);
}

/// Marks the batch failed with `errno` (reported by `wr_complete`), unless it already is.
fn fail_batch(qp: *mut ibv_qp_ex, errno: c_int) {
    ffi!((), {
        with(qp, |_, b| {
            if b.err == 0 {
                b.err = errno;
            }
        })
    })
}

/// `ibv_wr_send_tso(qp, hdr, hdr_sz, mss)`: the header is copied now (the API lets it go
/// after the call); NULL with a size fails the batch with `EINVAL`.
unsafe extern "C" fn wr_send_tso(qp: *mut ibv_qp_ex, hdr: *mut c_void, hdr_sz: u16, mss: u16) {
    if hdr.is_null() && hdr_sz > 0 {
        return fail_batch(qp, libc::EINVAL);
    }
    let hdr = if hdr_sz == 0 {
        Vec::new()
    } else {
        // SAFETY: the hdr_sz readable bytes the verb takes.
        unsafe { std::slice::from_raw_parts(hdr as *const u8, hdr_sz as usize) }.to_vec()
    };
    begin(qp, WrOpcode::TSO, 0, 0, |p| p.tso = Some((hdr, mss)));
}
/// `ibv_wr_atomic_write(qp, rkey, remote_addr, atomic_wr)`: the 8 bytes at `atomic_wr` are
/// copied into the WR (NULL fails the batch with `EINVAL`).
unsafe extern "C" fn wr_atomic_write(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    data: *const c_void,
) {
    if data.is_null() {
        return fail_batch(qp, libc::EINVAL);
    }
    // SAFETY: the 8 readable bytes the verb takes.
    let word = unsafe { std::ptr::read_unaligned(data as *const [u8; 8]) };
    begin(qp, WrOpcode::ATOMIC_WRITE, addr, rkey, |p| p.inline = Some(word.to_vec()));
}

/// The `wr_flush` slot's type (rdma-core 45 and later).
pub(crate) type WrFlush = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, usize, u8, u8);

/// `ibv_wr_flush(qp, rkey, remote_addr, len, type, level)` (full profile): an RDMA FLUSH of
/// the range, or of the whole MR (`IBV_FLUSH_MR`); a length beyond 32 bits (the RETH's) fails
/// the batch with `EINVAL`, as do a bad type or level at `wr_complete`.
pub(crate) unsafe extern "C" fn wr_flush(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    len: usize,
    placement: u8,
    level: u8,
) {
    let Ok(len) = u32::try_from(len) else { return fail_batch(qp, libc::EINVAL) };
    let placement = rdma_emu::FlushType::from_bits_retain(placement);
    let level = rdma_emu::FlushLevel(level);
    begin(qp, WrOpcode::FLUSH, addr, rkey, |p| {
        p.flush = Some(rdma_emu::Flush { len, placement, level })
    });
}

/// Runs `f` on the QP's batch.
fn with(qp: *mut ibv_qp_ex, f: impl FnOnce(&ShimQp, &mut Batch)) {
    // SAFETY: a live extended QP (these slots exist only on QPs this library created).
    if let Some(s) = unsafe { obj::<_, ShimQp>(qp) } {
        f(s, &mut s.batch.lock());
    }
}

/// Starts a new WR with the `wr_id` and `wr_flags` the application set on the QP.
fn begin(
    qp: *mut ibv_qp_ex,
    opcode: WrOpcode,
    remote_addr: u64,
    rkey: u32,
    fill: impl FnOnce(&mut Pending),
) {
    ffi!((), {
        with(qp, |s, b| {
            let mut p = Pending {
                wr_id: s.qp.wr_id,
                opcode,
                flags: s.qp.wr_flags,
                remote_addr,
                rkey,
                ..Default::default()
            };
            fill(&mut p);
            if b.wrs.len() >= s.emu.cap().max_send_wr as usize && b.err == 0 {
                b.err = libc::ENOSPC;
            }
            b.wrs.push(p);
        })
    })
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    ffi!((), {
        with(qp, |_, b| {
            b.wrs.clear();
            b.err = 0;
        })
    })
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    ffi!((), {
        with(qp, |_, b| {
            b.wrs.clear();
            b.err = 0;
        })
    })
}

/// Posts the batch; returns 0 or the errno of the first failure: the batch's own (a setter's),
/// `ENOSPC` when the send queue has no room for the whole batch (nothing is posted then, as a
/// builder that finds no slot fails the batch), or that of the WR that failed (those before it
/// stay posted).
unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    ffi!(libc::EIO, {
        let mut rc = 0;
        with(qp, |s, b| {
            let pending = std::mem::take(&mut b.wrs);
            if b.err != 0 {
                rc = std::mem::take(&mut b.err);
                return;
            }
            let mut wrs = Vec::with_capacity(pending.len());
            for p in &pending {
                let mut flags = SendFlags::from_bits_retain(p.flags);
                if p.inline.is_some() {
                    flags |= SendFlags::INLINE;
                }
                let bind = match p.bind {
                    Some((mw, rkey, ref info, held)) => {
                        // SAFETY: the application passed its own window and MR (checked
                        // against the registry).
                        let b = unsafe { super::mw::bind_request(mw, rkey, info) };
                        b.map(|b| MwBind { mw_rkey: Some(held), ..b })
                    }
                    None => None,
                };
                if p.opcode == WrOpcode::BIND_MW && bind.is_none() {
                    rc = libc::EINVAL;
                    return;
                }
                let ud = match p.ud {
                    // SAFETY: the application passed one of its address handles (checked
                    // against the registry).
                    Some((ah, qpn, qkey)) => match unsafe { super::qp::ud_dest(ah, qpn, qkey) } {
                        Some(d) => Some(d),
                        None => {
                            rc = libc::EINVAL;
                            return;
                        }
                    },
                    None => None,
                };
                wrs.push(SendWr {
                    wr_id: p.wr_id,
                    opcode: p.opcode,
                    send_flags: flags,
                    sg_list: &p.sges,
                    inline_data: p.inline.as_deref().unwrap_or(&[]),
                    imm_data: p.imm,
                    remote_addr: p.remote_addr,
                    rkey: p.rkey,
                    compare_add: p.compare_add,
                    swap: p.swap,
                    ud,
                    bind,
                    invalidate_rkey: p.invalidate_rkey,
                    xrc_remote_srqn: p.xrc_srqn,
                    tso: p.tso.as_ref().map(|(hdr, mss)| rdma_emu::Tso { hdr, mss: *mss }),
                    flush: p.flush,
                });
            }
            if let Err(e) = s.emu.post_send_built(&wrs) {
                rc = match e.errno().raw() {
                    libc::ENOMEM => libc::ENOSPC,
                    other => other,
                };
            }
        });
        rc
    })
}

unsafe extern "C" fn wr_bind_mw(
    qp: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    // SAFETY: NULL or the application's bind info, copied now (the API lets it go after the
    // call).
    let info = unsafe { info.as_ref() }.map(|i| ibv_mw_bind_info { ..*i });
    // The window's rkey as the application holds it now, which the bind names (rxe's builder
    // takes it here): a window this library did not make gives no bind (EINVAL at complete).
    // SAFETY: NULL or the application's window, checked against the registry before it is read.
    let held = unsafe { obj::<_, ShimMw>(mw) }.map(|m| m.mw.rkey);
    begin(qp, WrOpcode::BIND_MW, 0, 0, |p| {
        p.bind = info.zip(held).map(|(i, held)| (mw, rkey, i, held));
    });
}

unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    begin(qp, WrOpcode::LOCAL_INV, 0, 0, |p| p.invalidate_rkey = rkey);
}

unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    begin(qp, WrOpcode::SEND_WITH_INV, 0, 0, |p| p.invalidate_rkey = rkey);
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    begin(qp, WrOpcode::RDMA_WRITE, addr, rkey, |_| {});
}

unsafe extern "C" fn wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, addr: u64, imm: u32) {
    begin(qp, WrOpcode::RDMA_WRITE_WITH_IMM, addr, rkey, |p| p.imm = imm);
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    begin(qp, WrOpcode::SEND, 0, 0, |_| {});
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm: u32) {
    begin(qp, WrOpcode::SEND_WITH_IMM, 0, 0, |p| p.imm = imm);
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    begin(qp, WrOpcode::RDMA_READ, addr, rkey, |_| {});
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    compare: u64,
    swap: u64,
) {
    begin(qp, WrOpcode::ATOMIC_CMP_AND_SWP, addr, rkey, |p| {
        p.compare_add = compare;
        p.swap = swap;
    });
}

unsafe extern "C" fn wr_atomic_fetch_add(qp: *mut ibv_qp_ex, rkey: u32, addr: u64, add: u64) {
    begin(qp, WrOpcode::ATOMIC_FETCH_AND_ADD, addr, rkey, |p| p.compare_add = add);
}

/// Applies `f` to the last WR started (an error when there is none).
fn last(qp: *mut ibv_qp_ex, f: impl FnOnce(&ShimQp, &mut Pending) -> c_int) {
    ffi!((), {
        with(qp, |s, b| {
            let rc = match b.wrs.last_mut() {
                Some(p) => f(s, p),
                None => libc::EINVAL,
            };
            if rc != 0 && b.err == 0 {
                b.err = rc;
            }
        })
    })
}

unsafe extern "C" fn wr_set_ud_addr(qp: *mut ibv_qp_ex, ah: *mut ibv_ah, qpn: u32, qkey: u32) {
    last(qp, |_, p| {
        p.ud = Some((ah, qpn, qkey));
        0
    });
}

unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut ibv_qp_ex, srqn: u32) {
    last(qp, |_, p| {
        p.xrc_srqn = srqn;
        0
    });
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    last(qp, |_, p| {
        p.inline = None;
        p.sges.clear();
        p.sges.push(Sge { addr, length, lkey });
        0
    });
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    last(qp, |s, p| {
        if n > s.emu.cap().max_send_sge as usize || (n > 0 && list.is_null()) {
            return libc::ENOSPC;
        }
        p.inline = None;
        p.sges.clear();
        for i in 0..n {
            // SAFETY: the application passes n readable SGEs.
            let e = unsafe { &*list.add(i) };
            p.sges.push(Sge { addr: e.addr, length: e.length, lkey: e.lkey });
        }
        0
    });
}

/// Copies inline data from the application's buffers at the time of the call.
fn set_inline(qp: *mut ibv_qp_ex, bufs: &[(*const u8, usize)]) {
    last(qp, |s, p| {
        let total: usize = bufs.iter().map(|b| b.1).sum();
        if total > s.emu.cap().max_inline_data as usize {
            return libc::ENOSPC;
        }
        let mut data = Vec::with_capacity(total);
        for &(addr, len) in bufs {
            if len > 0 {
                // SAFETY: the application passes readable buffers of the given lengths.
                data.extend_from_slice(unsafe { std::slice::from_raw_parts(addr, len) });
            }
        }
        p.sges.clear();
        p.inline = Some(data);
        0
    });
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    set_inline(qp, &[(addr as *const u8, length)]);
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_data_buf,
) {
    let bufs: Vec<(*const u8, usize)> = (0..n)
        // SAFETY: the application passes n readable ibv_data_buf entries.
        .map(|i| unsafe { ((*list.add(i)).addr as *const u8, (*list.add(i)).length) })
        .collect();
    set_inline(qp, &bufs);
}
