/* SRQs through the C ABI: two QPs share one SRQ, ibv_post_srq_recv, query/modify, the limit
 * event through ibv_get_async_event, and EBUSY while QPs use it. Prints "ok". */
#include "common.h"

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct side a = { 0 }, b = { 0 }, c = { 0 };
	struct ibv_srq_init_attr sattr = { .srq_context = &b, .attr = { .max_wr = 10, .max_sge = 1 } };
	struct ibv_srq *srq;
	struct ibv_srq_attr q;
	struct ibv_async_event ev;

	CHECK(list && n >= 2);
	setup(&a, list[0]);
	setup(&c, list[0]);
	setup_base(&b, list[1]);
	CHECK(b.cq = ibv_create_cq(b.ctx, 32, NULL, NULL, 0));
	CHECK(srq = ibv_create_srq(b.pd, &sattr));
	CHECK(sattr.attr.max_wr == 15 && srq->srq_context == &b);

	/* Two receiver QPs on b, both on the SRQ, connected to a and c. */
	struct side b2 = b;
	struct ibv_qp_init_attr init = { .send_cq = b.cq, .recv_cq = b.cq, .srq = srq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_send_sge = 1 } };
	CHECK(b.qp = ibv_create_qp(b.pd, &init));
	CHECK(b2.qp = ibv_create_qp(b.pd, &init));
	connect_to(&a, &b);
	connect_to(&b, &a);
	connect_to(&c, &b2);
	connect_to(&b2, &c);
	{
		struct ibv_qp_attr qa;
		struct ibv_qp_init_attr qi;
		CHECK(ibv_query_qp(b.qp, &qa, IBV_QP_STATE, &qi) == 0 && qi.srq == srq);
	}

	for (int i = 0; i < 4; i++) {
		struct ibv_sge sge = { (uintptr_t)b.buf + 64 * i, 64, b.mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 100 + i, .sg_list = &sge, .num_sge = 1 }, *bad;
		CHECK(ibv_post_srq_recv(srq, &wr, &bad) == 0);
	}
	{
		struct ibv_recv_wr wr = { .wr_id = 1 }, *bad;
		CHECK(ibv_post_recv(b.qp, &wr, &bad) == EINVAL && bad == &wr);
	}
	q.srq_limit = 3;
	CHECK(ibv_modify_srq(srq, &q, IBV_SRQ_LIMIT) == 0);
	CHECK(ibv_query_srq(srq, &q) == 0 && q.max_wr == 15 && q.srq_limit == 3);

	/* a then c send; both land in SRQ buffers in order. */
	strcpy(a.buf, "from a");
	strcpy(c.buf, "from c");
	struct ibv_sge sa = { (uintptr_t)a.buf, 7, a.mr->lkey }, sc = { (uintptr_t)c.buf, 7, c.mr->lkey };
	struct ibv_send_wr wa = { .wr_id = 1, .sg_list = &sa, .num_sge = 1, .opcode = IBV_WR_SEND }, *bad;
	struct ibv_send_wr wc_ = wa;
	wc_.sg_list = &sc;
	CHECK(ibv_post_send(a.qp, &wa, &bad) == 0);
	CHECK(ibv_post_send(c.qp, &wc_, &bad) == 0);
	struct ibv_wc w1 = wait_wc(b.cq), w2 = wait_wc(b.cq);
	CHECK(w1.wr_id == 100 && w1.qp_num == b.qp->qp_num && w2.wr_id == 101 && w2.qp_num == b2.qp->qp_num);
	CHECK(strcmp(b.buf, "from a") == 0 && strcmp(b.buf + 64, "from c") == 0);

	/* Two left, below the limit of 3: SRQ_LIMIT_REACHED on this SRQ. */
	CHECK(ibv_get_async_event(b.ctx, &ev) == 0);
	CHECK(ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && ev.element.srq == srq);
	ibv_ack_async_event(&ev);

	CHECK(ibv_destroy_srq(srq) == EBUSY);
	CHECK(ibv_destroy_qp(b.qp) == 0 && ibv_destroy_qp(b2.qp) == 0);
	CHECK(ibv_destroy_srq(srq) == 0);
	printf("srq ok\n");
	return 0;
}
