//! Object counts up to the maxima a device reports (rxe's in both profiles, in one process):
//! every one of them can really be created, one more fails with the kernel's `ENOMEM`, and
//! destroying one makes room for one. (One test per binary: it takes a few GiB at its peak.)

mod common;
use common::*;
use rdma_emu::*;

/// Creates objects with `make` until `max` exist, checks that one more is refused with
/// `ENOMEM` and that one fits again once one is dropped; then drops them all.
fn up_to<T>(what: &str, max: u32, mut make: impl FnMut(u32) -> Result<T>) {
    let mut made = Vec::with_capacity(max as usize);
    for i in 0..max {
        match make(i) {
            Ok(o) => made.push(o),
            Err(e) => panic!("{what} {i} of {max}: {e}"),
        }
    }
    match make(max) {
        Err(e) => assert_eq!(e.errno(), Errno::ENOMEM, "{what} beyond {max}: {e}"),
        Ok(_) => panic!("{what}: one more than the reported {max} was created"),
    }
    made.pop();
    made.push(make(max).unwrap_or_else(|e| panic!("{what}: none fits after one went: {e}")));
}

#[test]
fn every_object_kind_can_be_created_up_to_its_reported_maximum_and_not_beyond() {
    let f = Fabric::new(FabricConfig { devices: 1, profile: Profile::Rxe, ..Default::default() });
    let dev = &f.devices()[0];
    let a = dev.attr();
    let n = node_on(dev, 64);
    let ep = n.qp.endpoint(0);
    // Each kind below counts what this node holds already (one PD, CQ, MR and QP).
    up_to("PD", a.max_pd - 1, |_| n.ctx.alloc_pd());
    up_to("CQ", a.max_cq - 1, |_| n.ctx.create_cq(1, None, 0));
    up_to("MR", a.max_mr - 1, |_| n.pd.reg_mr(8, AccessFlags::LOCAL_WRITE));
    up_to("QP", a.max_qp - 1, |_| n.pd.create_qp(&QpInitAttr::new(QpType::RC, &n.cq, cap(1))));
    up_to("SRQ", a.max_srq, |_| n.pd.create_srq(&SrqAttr { max_wr: 1, max_sge: 1, srq_limit: 0 }));
    let ah = AhAttr { is_global: true, dgid: ep.gid, port_num: 1, ..Default::default() };
    up_to("AH", a.max_ah, |_| n.pd.create_ah(&ah));
    up_to("MW", a.max_mw, |_| n.pd.alloc_mw(MwType::TYPE_2));
}
