//! The `ibv_copy_*_from_kern` / `_to_kern` conversions between the kernel's uverbs structs and
//! libibverbs' (pure field copies, equal to rdma-core's as a test checks). A NULL argument is
//! ignored with `EINVAL` rather than dereferenced.

use crate::{
    abi::{
        ib_user_path_rec, ib_uverbs_ah_attr, ib_uverbs_qp_attr, ibv_ah_attr, ibv_qp_attr,
        ibv_sa_path_rec,
    },
    boundary::set_errno,
};

/// Assigns each named field of `src` to the same field of `dst`, converting as C's assignment
/// does (narrowing truncates: the kernel's 32-bit `mtu` lands in libibverbs' byte).
macro_rules! copy_fields {
    ($dst:ident, $src:ident; $($f:ident),* $(,)?) => {
        $( $dst.$f = $src.$f as _; )*
    };
}

/// Both pointers, or `None` (with `EINVAL`) when either is NULL.
///
/// # Safety
/// Non-NULL pointers must point at valid, distinct structs of their types.
unsafe fn pair<'a, D, S>(dst: *mut D, src: *const S) -> Option<(&'a mut D, &'a S)> {
    if dst.is_null() || src.is_null() {
        set_errno(libc::EINVAL);
        return None;
    }
    // SAFETY: non-NULL, valid and distinct per the caller's contract (the verbs' own).
    Some(unsafe { (&mut *dst, &*src) })
}

fn ah_from_kern(dst: &mut ibv_ah_attr, src: &ib_uverbs_ah_attr) {
    dst.grh.dgid.raw = src.grh.dgid;
    let (g, k) = (&mut dst.grh, &src.grh);
    copy_fields!(g, k; flow_label, sgid_index, hop_limit, traffic_class);
    copy_fields!(dst, src; dlid, sl, src_path_bits, static_rate, is_global, port_num);
}

/// `ibv_copy_ah_attr_from_kern(dst, src)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_copy_ah_attr_from_kern(
    dst: *mut ibv_ah_attr,
    src: *mut ib_uverbs_ah_attr,
) {
    // SAFETY: the caller's structs (the verb's contract); NULL refused by `pair`.
    if let Some((dst, src)) = unsafe { pair(dst, src) } {
        ah_from_kern(dst, src);
    }
}

/// `ibv_copy_qp_attr_from_kern(dst, src)`: as libibverbs, every field but `qp_state` (which
/// the kernel's reply carries elsewhere) and `rate_limit`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_copy_qp_attr_from_kern(
    dst: *mut ibv_qp_attr,
    src: *mut ib_uverbs_qp_attr,
) {
    // SAFETY: as above.
    let Some((dst, src)) = (unsafe { pair(dst, src) }) else { return };
    copy_fields!(dst, src; cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn,
        dest_qp_num, qp_access_flags);
    let cap = &mut dst.cap;
    copy_fields!(cap, src; max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data);
    ah_from_kern(&mut dst.ah_attr, &src.ah_attr);
    ah_from_kern(&mut dst.alt_ah_attr, &src.alt_ah_attr);
    copy_fields!(dst, src; pkey_index, alt_pkey_index, en_sqd_async_notify, sq_draining,
        max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt,
        rnr_retry, alt_port_num, alt_timeout);
}

/// Copies a path record's fields between the kernel's and libibverbs' layouts (the same
/// names in both).
macro_rules! path_rec {
    ($dst:ident, $src:ident) => {
        copy_fields!($dst, $src; dlid, slid, raw_traffic, flow_label, hop_limit, traffic_class,
            reversible, numb_path, pkey, sl, mtu_selector, mtu, rate_selector, rate,
            packet_life_time, preference, packet_life_time_selector);
    };
}

/// `ibv_copy_path_rec_from_kern(dst, src)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_copy_path_rec_from_kern(
    dst: *mut ibv_sa_path_rec,
    src: *mut ib_user_path_rec,
) {
    // SAFETY: as above.
    let Some((dst, src)) = (unsafe { pair(dst, src) }) else { return };
    dst.dgid.raw = src.dgid;
    dst.sgid.raw = src.sgid;
    path_rec!(dst, src);
}

/// `ibv_copy_path_rec_to_kern(dst, src)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__ibv_copy_path_rec_to_kern(
    dst: *mut ib_user_path_rec,
    src: *mut ibv_sa_path_rec,
) {
    // SAFETY: as above.
    let Some((dst, src)) = (unsafe { pair(dst, src) }) else { return };
    dst.dgid = src.dgid.raw;
    dst.sgid = src.sgid.raw;
    path_rec!(dst, src);
}
