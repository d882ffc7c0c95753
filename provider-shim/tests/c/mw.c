/* Memory windows through the C ABI: ibv_alloc_mw / ibv_bind_mw (type 1) / ibv_dealloc_mw, a
 * type 2 window bound by IBV_WR_BIND_MW and by ibv_wr_bind_mw, invalidated by LOCAL_INV and by
 * SEND_WITH_INV, and remote access through valid, stale and out-of-range windows.
 * Prints "mw ok". */
#include "common.h"

/* a writes len bytes from its buffer to (addr, rkey) on b; returns the completion status. */
static int remote_write(struct side *a, uint64_t addr, uint32_t rkey, int len)
{
	struct ibv_sge sge = { (uintptr_t)a->buf, len, a->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 77, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.rdma.remote_addr = addr;
	wr.wr.rdma.rkey = rkey;
	CHECK(ibv_post_send(a->qp, &wr, &bad) == 0);
	return wait_wc(a->cq).status;
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct side a, b;
	struct ibv_device_attr da;
	char *tbuf = aligned_alloc(4096, BUF);
	struct ibv_mr *target;
	struct ibv_mw *mw1, *mw2;
	struct ibv_wc wc;

	CHECK(list && n >= 2 && tbuf);
	setup_pair(list, &a, &b);
	CHECK(ibv_query_device(b.ctx, &da) == 0);
	CHECK(da.max_mw > 0 && (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW));
	CHECK(target = ibv_reg_mr(b.pd, tbuf, BUF, ALL_ACCESS | IBV_ACCESS_MW_BIND));

	/* Type 1: bound by ibv_bind_mw, the rkey moves by ibv_inc_rkey. */
	CHECK(mw1 = ibv_alloc_mw(b.pd, IBV_MW_TYPE_1));
	CHECK(mw1->type == IBV_MW_TYPE_1 && mw1->pd == b.pd && mw1->context == b.ctx);
	uint32_t old = mw1->rkey;
	struct ibv_mw_bind bind = { .wr_id = 5, .send_flags = IBV_SEND_SIGNALED,
				    .bind_info = { .mr = target, .addr = (uintptr_t)tbuf + 256,
						   .length = 512, .mw_access_flags = IBV_ACCESS_REMOTE_WRITE } };
	CHECK(ibv_bind_mw(b.qp, mw1, &bind) == 0);
	CHECK(mw1->rkey == ibv_inc_rkey(old));
	wc = wait_wc(b.cq);
	CHECK(wc.wr_id == 5 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW);
	strcpy(a.buf, "window");
	CHECK(remote_write(&a, (uintptr_t)tbuf + 256, mw1->rkey, 7) == IBV_WC_SUCCESS);
	CHECK(strcmp(tbuf + 256, "window") == 0);
	CHECK(ibv_dereg_mr(target) == EINVAL); /* a window is bound to it */
	{
		/* The inline wrapper's checks and the provider's. */
		struct ibv_mw_bind zb = bind;
		zb.bind_info.mw_access_flags |= IBV_ACCESS_ZERO_BASED;
		CHECK(ibv_bind_mw(b.qp, mw1, &zb) == EINVAL);
		struct ibv_mw_bind nomr = bind;
		nomr.bind_info.mr = NULL;
		CHECK(ibv_bind_mw(b.qp, mw1, &nomr) == EINVAL);
	}
	/* One byte beyond the window, inside the MR: a remote access error. */
	CHECK(remote_write(&a, (uintptr_t)tbuf + 256 + 511, mw1->rkey, 2) == IBV_WC_REM_ACCESS_ERR);

	/* Type 2 on a fresh pair: IBV_WR_BIND_MW, then LOCAL_INV. */
	setup_pair(list, &a, &b);
	CHECK(target = ibv_reg_mr(b.pd, tbuf, BUF, ALL_ACCESS | IBV_ACCESS_MW_BIND));
	CHECK(mw2 = ibv_alloc_mw(b.pd, IBV_MW_TYPE_2));
	CHECK(ibv_bind_mw(b.qp, mw2, &bind) == EINVAL); /* type 2 is bound by a work request */
	uint32_t rkey2 = ibv_inc_rkey(mw2->rkey);
	struct ibv_send_wr wr = { .wr_id = 6, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.bind_mw.mw = mw2;
	wr.bind_mw.rkey = rkey2;
	wr.bind_mw.bind_info = (struct ibv_mw_bind_info){ .mr = target, .addr = (uintptr_t)tbuf,
		.length = 128, .mw_access_flags = IBV_ACCESS_REMOTE_WRITE };
	CHECK(ibv_post_send(b.qp, &wr, &bad) == 0);
	wc = wait_wc(b.cq);
	CHECK(wc.wr_id == 6 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW);
	mw2->rkey = rkey2;
	CHECK(remote_write(&a, (uintptr_t)tbuf, rkey2, 7) == IBV_WC_SUCCESS);
	struct ibv_send_wr inv = { .wr_id = 7, .opcode = IBV_WR_LOCAL_INV, .send_flags = IBV_SEND_SIGNALED };
	inv.invalidate_rkey = rkey2;
	CHECK(ibv_post_send(b.qp, &inv, &bad) == 0);
	wc = wait_wc(b.cq);
	CHECK(wc.wr_id == 7 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_LOCAL_INV);
	CHECK(remote_write(&a, (uintptr_t)tbuf, rkey2, 7) == IBV_WC_REM_ACCESS_ERR);

	/* Type 2 by ibv_wr_bind_mw on an extended QP, invalidated by the peer's SEND_WITH_INV. */
	setup_pair(list, &a, &b);
	CHECK(target = ibv_reg_mr(b.pd, tbuf, BUF, ALL_ACCESS | IBV_ACCESS_MW_BIND));
	CHECK(mw2 = ibv_alloc_mw(b.pd, IBV_MW_TYPE_2));
	{
		struct ibv_qp_init_attr_ex x = {
			.qp_type = IBV_QPT_RC, .send_cq = b.cq, .recv_cq = b.cq,
			.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
			.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = b.pd,
			.send_ops_flags = IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV |
					  IBV_QP_EX_WITH_SEND_WITH_INV,
		};
		struct ibv_qp_attr reset = { .qp_state = IBV_QPS_RESET };
		CHECK(ibv_destroy_qp(b.qp) == 0);
		CHECK(b.qp = ibv_create_qp_ex(b.ctx, &x));
		CHECK(ibv_modify_qp(a.qp, &reset, IBV_QP_STATE) == 0);
		connect_to(&b, &a);
		connect_to(&a, &b);
	}
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(b.qp);
	CHECK(qx);
	uint32_t rkey3 = ibv_inc_rkey(mw2->rkey);
	struct ibv_mw_bind_info bi = { .mr = target, .addr = (uintptr_t)tbuf + 1024, .length = 64,
				       .mw_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |
							  IBV_ACCESS_ZERO_BASED };
	ibv_wr_start(qx);
	qx->wr_id = 8;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(qx, mw2, rkey3, &bi);
	CHECK(ibv_wr_complete(qx) == 0);
	wc = wait_wc(b.cq);
	CHECK(wc.wr_id == 8 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW);
	mw2->rkey = rkey3;
	strcpy(a.buf, "zero");
	CHECK(remote_write(&a, 3, rkey3, 5) == IBV_WC_SUCCESS); /* zero based: offset 3 */
	CHECK(strcmp(tbuf + 1024 + 3, "zero") == 0);
	{
		struct ibv_sge rs = { (uintptr_t)b.buf, 64, b.mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = 9, .sg_list = &rs, .num_sge = 1 }, *rbad;
		CHECK(ibv_post_recv(b.qp, &rw, &rbad) == 0);
		struct ibv_sge ss = { (uintptr_t)a.buf, 4, a.mr->lkey };
		struct ibv_send_wr sw = { .wr_id = 10, .sg_list = &ss, .num_sge = 1,
					  .opcode = IBV_WR_SEND_WITH_INV, .send_flags = IBV_SEND_SIGNALED };
		sw.invalidate_rkey = rkey3;
		CHECK(ibv_post_send(a.qp, &sw, &bad) == 0);
		wc = wait_wc(a.cq);
		CHECK(wc.wr_id == 10 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND);
		wc = wait_wc(b.cq);
		CHECK(wc.wr_id == 9 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV);
		CHECK((wc.wc_flags & IBV_WC_WITH_INV) && wc.invalidated_rkey == rkey3);
	}
	CHECK(remote_write(&a, 3, rkey3, 5) == IBV_WC_REM_ACCESS_ERR);
	CHECK(ibv_dealloc_mw(mw2) == 0);
	CHECK(ibv_dereg_mr(target) == 0);
	CHECK(ibv_alloc_mw(b.pd, 7) == NULL && errno == EINVAL);
	printf("mw ok\n");
	return 0;
}
