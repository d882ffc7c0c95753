//! The function tables libibverbs' inline verbs call through: `ibv_context.ops` and the
//! `verbs_context` slots in front of it (see shared/design/abi.md §2).

use crate::abi::verbs_context;

/// Fills the slots of a new context on a device with attributes `attr`. The slots of optional
/// features stay NULL where the device lacks them, so that libibverbs answers `EOPNOTSUPP`
/// exactly as for a provider without them (rxe).
pub(crate) fn fill(v: &mut verbs_context, attr: &rdma_emu::DeviceAttr) {
    let ops = &mut v.context.ops;
    ops.poll_cq = Some(super::cq::poll_cq);
    ops.req_notify_cq = Some(super::cq::req_notify_cq);
    ops.post_send = Some(super::qp::post_send);
    ops.post_recv = Some(super::qp::post_recv);
    ops.post_srq_recv = Some(super::srq::post_srq_recv);
    ops.alloc_mw = Some(super::mw::alloc_mw);
    ops.bind_mw = Some(super::mw::bind_mw);
    ops.dealloc_mw = Some(super::mw::dealloc_mw);
    v.query_port = Some(super::device::query_port);
    v.query_device_ex = Some(super::device::query_device_ex);
    v.create_cq_ex = Some(super::cq::create_cq_ex);
    v.create_qp_ex = Some(super::qp::create_qp_ex);
    v.open_xrcd = Some(super::xrc::open_xrcd);
    v.close_xrcd = Some(super::xrc::close_xrcd);
    v.create_srq_ex = Some(super::xrc::create_srq_ex);
    v.get_srq_num = Some(super::xrc::get_srq_num);
    v.open_qp = Some(super::xrc::open_qp);
    if attr.has_cq_moderation() {
        v.modify_cq = Some(super::cq::modify_cq);
    }
    if attr.max_dm_size > 0 {
        v.alloc_dm = Some(super::dm::alloc_dm);
        v.free_dm = Some(super::dm::free_dm);
        v.reg_dm_mr = Some(super::dm::reg_dm_mr);
    }
    if attr.has_raw_packet() {
        v.create_wq = Some(super::wq::create_wq);
        v.modify_wq = Some(super::wq::modify_wq);
        v.destroy_wq = Some(super::wq::destroy_wq);
        v.create_rwq_ind_table = Some(super::wq::create_rwq_ind_table);
        v.destroy_rwq_ind_table = Some(super::wq::destroy_rwq_ind_table);
        v.ibv_create_flow = Some(super::wq::create_flow);
        v.ibv_destroy_flow = Some(super::wq::destroy_flow);
    }
    if attr.odp.general != 0 {
        v.advise_mr = Some(super::pd_mr::advise_mr);
    }
    if attr.tm.max_num_tags > 0 {
        v.post_srq_ops = Some(super::srq::post_srq_ops);
    }
    if attr.parent_domains {
        v.alloc_td = Some(super::parent::alloc_td);
        v.dealloc_td = Some(super::parent::dealloc_td);
        v.alloc_parent_domain = Some(super::parent::alloc_parent_domain);
    }
    if attr.has_clock() {
        v.query_rt_values = Some(super::device::query_rt_values);
    }
}
