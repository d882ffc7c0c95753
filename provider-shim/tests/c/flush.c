/* RDMA FLUSH through ibv_wr_flush, as a program built against rdma-core 45 or later (whose
 * headers Debian 12 lacks: their names are declared here) uses it. Full profile: the device
 * caps, FLUSH access on MRs and QPs, a WRITE then a FLUSH completing as IBV_WC_FLUSH, a FLUSH
 * of memory without the right failing. rxe profile (Linux 6.1): none of it. */
#include "common.h"

#define IBV_ACCESS_FLUSH_GLOBAL (1 << 8)
#define IBV_ACCESS_FLUSH_PERSISTENT (1 << 9)
#define IBV_QP_EX_WITH_FLUSH (1 << 11)
#define IBV_WC_FLUSH 8
#define IBV_FLUSH_GLOBAL 1
#define IBV_FLUSH_PERSISTENT 2
#define IBV_FLUSH_RANGE 0
#define IBV_FLUSH_MR 1
#define IBV_DEVICE_FLUSH_GLOBAL (1ULL << 38)
#define IBV_DEVICE_FLUSH_PERSISTENT (1ULL << 39)
#define IBV_DEVICE_ATOMIC_WRITE (1ULL << 40)

/* rdma-core 45's struct ibv_qp_ex: 44's and one slot more. */
struct qp_ex_45 {
	struct ibv_qp_ex base;
	void (*wr_flush)(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr, size_t len,
			 uint8_t type, uint8_t level);
};

static struct ibv_qp *flush_qp(struct side *s, uint64_t ops)
{
	struct ibv_qp_init_attr_ex x = { .qp_type = IBV_QPT_RC, .send_cq = s->cq, .recv_cq = s->cq,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = s->pd,
		.send_ops_flags = ops };
	return ibv_create_qp_ex(s->ctx, &x);
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	const char *profile = getenv("RDMA_EMU_PROFILE");
	int rxe = profile && strcmp(profile, "rxe") == 0;
	struct side a = { 0 }, b = { 0 };
	uint64_t ops = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_FLUSH;
	int rights = IBV_ACCESS_FLUSH_GLOBAL | IBV_ACCESS_FLUSH_PERSISTENT;

	CHECK(list && list[0] && list[1]);
	setup(&a, list[0]);
	setup(&b, list[1]);
	struct ibv_device_attr_ex dx;
	CHECK(ibv_query_device_ex(a.ctx, NULL, &dx) == 0);
	uint64_t caps = IBV_DEVICE_FLUSH_GLOBAL | IBV_DEVICE_FLUSH_PERSISTENT | IBV_DEVICE_ATOMIC_WRITE;
	if (rxe) {
		CHECK((dx.device_cap_flags_ex & caps) == 0);
		CHECK(!flush_qp(&a, ops) && errno == EOPNOTSUPP);
		CHECK(!ibv_reg_mr(b.pd, b.buf, 64, ALL_ACCESS | IBV_ACCESS_FLUSH_GLOBAL) && errno == EINVAL);
		printf("flush ok\n");
		return 0;
	}
	CHECK((dx.device_cap_flags_ex & caps) == caps);
	CHECK(ibv_destroy_qp(a.qp) == 0);
	CHECK(a.qp = flush_qp(&a, ops));
	connect_to(&a, &b);
	connect_to(&b, &a);
	/* The responder's QP must allow FLUSH too. */
	struct ibv_qp_attr qa = { .qp_access_flags = ALL_ACCESS | rights };
	CHECK(ibv_modify_qp(b.qp, &qa, IBV_QP_ACCESS_FLAGS) == 0);
	struct ibv_mr *mr = ibv_reg_mr(b.pd, b.buf + 1024, 1024, ALL_ACCESS | rights);
	struct ibv_mr *plain = ibv_reg_mr(b.pd, b.buf + 2048, 1024, ALL_ACCESS);
	CHECK(mr && plain);

	struct qp_ex_45 *qx = (struct qp_ex_45 *)ibv_qp_to_qp_ex(a.qp);
	CHECK(qx && qx->wr_flush);
	memcpy(a.buf, "flushed!", 8);
	ibv_wr_start(&qx->base);
	qx->base.wr_id = 1;
	qx->base.wr_flags = 0;
	ibv_wr_rdma_write(&qx->base, mr->rkey, (uintptr_t)b.buf + 1024);
	ibv_wr_set_sge(&qx->base, a.mr->lkey, (uintptr_t)a.buf, 8);
	qx->base.wr_id = 2;
	qx->base.wr_flags = IBV_SEND_SIGNALED;
	qx->wr_flush(&qx->base, mr->rkey, (uintptr_t)b.buf + 1024, 8,
		     IBV_FLUSH_GLOBAL | IBV_FLUSH_PERSISTENT, IBV_FLUSH_RANGE);
	qx->base.wr_id = 3;
	qx->wr_flush(&qx->base, mr->rkey, 0, 0, IBV_FLUSH_GLOBAL, IBV_FLUSH_MR);
	CHECK(ibv_wr_complete(&qx->base) == 0);
	struct ibv_wc wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 2 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_FLUSH);
	wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 3 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_FLUSH);
	CHECK(memcmp(b.buf + 1024, "flushed!", 8) == 0);
	/* A type that is neither placement: wr_complete refuses the batch. */
	ibv_wr_start(&qx->base);
	qx->wr_flush(&qx->base, mr->rkey, (uintptr_t)b.buf + 1024, 8, 0, IBV_FLUSH_RANGE);
	CHECK(ibv_wr_complete(&qx->base) == EINVAL);
	/* Memory registered without the FLUSH rights: a remote access error. */
	ibv_wr_start(&qx->base);
	qx->base.wr_id = 4;
	qx->wr_flush(&qx->base, plain->rkey, (uintptr_t)b.buf + 2048, 8, IBV_FLUSH_GLOBAL,
		     IBV_FLUSH_RANGE);
	CHECK(ibv_wr_complete(&qx->base) == 0);
	wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 4 && wc.status == IBV_WC_REM_ACCESS_ERR);
	printf("flush ok\n");
	return 0;
}
