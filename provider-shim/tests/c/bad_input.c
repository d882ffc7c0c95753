/* NULL, destroyed and foreign handles passed to exported verbs give an errno (or NULL with
 * errno), never a crash. Prints "ok". */
#include "common.h"

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct side a = { 0 };
	char junk[256] = { 0 };
	struct ibv_async_event ev;

	CHECK(list && n >= 1);
	setup(&a, list[0]);

	/* NULL pointers. */
	errno = 0;
	CHECK(ibv_alloc_pd(NULL) == NULL && errno == EINVAL);
	errno = 0;
	CHECK(ibv_reg_mr(NULL, a.buf, 64, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EINVAL);
	errno = 0;
	CHECK(ibv_create_qp(a.pd, NULL) == NULL && errno == EINVAL);
	errno = 0;
	CHECK(ibv_create_cq(NULL, 4, NULL, NULL, 0) == NULL && errno == EINVAL);
	CHECK(ibv_modify_qp(NULL, NULL, IBV_QP_STATE) == EINVAL);
	CHECK(ibv_query_device(a.ctx, NULL) == EINVAL);
	CHECK(ibv_get_device_name(NULL) == NULL);
	/* A device struct of the program's own making (bindings' unit tests build them): its
	 * name, as libibverbs reads it. */
	{
		struct ibv_device mock;

		memset(&mock, 0, sizeof mock);
		strcpy(mock.name, "mock0");
		CHECK(strcmp(ibv_get_device_name(&mock), "mock0") == 0);
	}
	CHECK(ibv_get_async_event(a.ctx, NULL) == -1 && errno == EINVAL);
	CHECK(ibv_dealloc_pd(NULL) == EINVAL && ibv_dereg_mr(NULL) == EINVAL);
	CHECK(ibv_destroy_cq(NULL) == EINVAL && ibv_destroy_qp(NULL) == EINVAL);

	/* A work request list whose `next` loops back: the queue fills, ENOMEM names it. */
	{
		struct side p, q;
		struct ibv_sge sg;
		struct ibv_send_wr sw = { .wr_id = 9, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE };
		struct ibv_recv_wr rw = { .wr_id = 10, .num_sge = 1 };
		struct ibv_send_wr *sbad = NULL;
		struct ibv_recv_wr *rbad = NULL;

		CHECK(n >= 2);
		setup_pair(list, &p, &q);
		sg = (struct ibv_sge){ (uintptr_t)p.buf, 8, p.mr->lkey };
		sw.sg_list = rw.sg_list = &sg;
		sw.wr.rdma.remote_addr = (uintptr_t)q.buf;
		sw.wr.rdma.rkey = q.mr->rkey;
		sw.next = &sw;
		rw.next = &rw;
		CHECK(ibv_post_send(p.qp, &sw, &sbad) == ENOMEM && sbad == &sw);
		CHECK(ibv_post_recv(p.qp, &rw, &rbad) == ENOMEM && rbad == &rw);
		CHECK(ibv_close_device(p.ctx) == 0 && ibv_close_device(q.ctx) == 0);
	}

	/* A request posted to a QP in RESET is refused (EINVAL, bad_wr naming it), as by mlx5
	 * from rdma-core 40 on (which queued it before) and by rxe; so is a receive. */
	{
		struct ibv_sge sg = { (uintptr_t)a.buf, 8, a.mr->lkey };
		struct ibv_send_wr sw = { .wr_id = 11, .sg_list = &sg, .num_sge = 1,
					  .opcode = IBV_WR_SEND };
		struct ibv_send_wr *sbad = NULL;
		struct ibv_qp_attr qa;
		struct ibv_qp_init_attr qi;

		CHECK(ibv_query_qp(a.qp, &qa, IBV_QP_STATE | IBV_QP_CAP, &qi) == 0);
		CHECK(qa.qp_state == IBV_QPS_RESET && qa.cap.max_send_wr > 0);
		CHECK(ibv_post_send(a.qp, &sw, &sbad) == EINVAL && sbad == &sw);
		struct ibv_recv_wr rw = { .wr_id = 12, .sg_list = &sg, .num_sge = 1 };
		struct ibv_recv_wr *rbad = NULL;
		CHECK(ibv_post_recv(a.qp, &rw, &rbad) == EINVAL && rbad == &rw);
	}

	/* Foreign pointers: memory this library never handed out. */
	CHECK(ibv_dealloc_pd((struct ibv_pd *)junk) == EINVAL);
	CHECK(ibv_destroy_cq((struct ibv_cq *)junk) == EINVAL);
	CHECK(ibv_close_device((struct ibv_context *)junk) == EINVAL);
	/* A completion channel that is none (found by the fuzzer: the CQ was made without one,
	 * its struct naming the junk). */
	errno = 0;
	CHECK(ibv_create_cq(a.ctx, 4, NULL, (struct ibv_comp_channel *)junk, 0) == NULL &&
	      errno == EINVAL);
	errno = 0;
	CHECK(ibv_create_cq(a.ctx, 4, NULL, (struct ibv_comp_channel *)a.pd, 0) == NULL &&
	      errno == EINVAL);
	{
		struct ibv_cq_init_attr_ex cqa = { .cqe = 4,
						   .channel = (struct ibv_comp_channel *)junk };

		errno = 0;
		CHECK(ibv_create_cq_ex(a.ctx, &cqa) == NULL && errno == EINVAL);
	}
	/* A handle of the wrong type. */
	CHECK(ibv_dealloc_pd((struct ibv_pd *)a.mr) == EINVAL);
	CHECK(ibv_dereg_mr(a.mr) == 0);

	/* Destroyed handles. */
	CHECK(ibv_dereg_mr(a.mr) == EINVAL);
	CHECK(ibv_destroy_qp(a.qp) == 0);
	CHECK(ibv_destroy_qp(a.qp) == EINVAL);
	{
		struct ibv_qp_attr attr = { .qp_state = IBV_QPS_INIT };
		CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == EINVAL);
	}
	CHECK(ibv_destroy_cq(a.cq) == 0);
	CHECK(ibv_destroy_cq(a.cq) == EINVAL);
	CHECK(ibv_destroy_comp_channel(a.ch) == 0);
	CHECK(ibv_destroy_comp_channel(a.ch) == EINVAL);
	{
		struct ibv_cq *cq;
		void *cq_ctx;
		CHECK(ibv_get_cq_event(a.ch, &cq, &cq_ctx) == -1 && errno == EINVAL);
	}
	CHECK(ibv_dealloc_pd(a.pd) == 0);
	CHECK(ibv_dealloc_pd(a.pd) == EINVAL);
	CHECK(ibv_close_device(a.ctx) == 0);
	CHECK(ibv_close_device(a.ctx) == EINVAL);
	CHECK(ibv_get_async_event(a.ctx, &ev) == -1 && errno == EINVAL);
	ibv_free_device_list(list);
	printf("bad_input ok\n");
	return 0;
}
