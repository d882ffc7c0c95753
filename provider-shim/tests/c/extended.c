/* The extended verbs: ibv_query_device_ex, ibv_create_cq_ex with start/next/end_poll and the
 * ibv_wc_read_* functions, ibv_create_qp_ex + ibv_qp_to_qp_ex and the ibv_wr_* API (SEND with
 * an SGE and with inline data, RDMA WRITE, FETCH_ADD), and their errors. Prints "ok". */
#include "common.h"

#define WC_FLAGS (IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM | \
		  IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID)

static void setup_ex(struct side *s, struct ibv_device *dev)
{
	struct ibv_cq_init_attr_ex cq_attr = { .cqe = 64, .cq_context = s, .wc_flags = WC_FLAGS };
	struct ibv_qp_init_attr_ex qp_attr = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = 64 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE |
				  IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_SEND_WITH_IMM |
				  IBV_QP_EX_WITH_ATOMIC_WRITE,
	};
	struct ibv_cq_ex *cq;

	setup_base(s, dev);
	CHECK(cq = ibv_create_cq_ex(s->ctx, &cq_attr));
	s->cqx = cq;
	s->cq = ibv_cq_ex_to_cq(cq);
	qp_attr.pd = s->pd;
	qp_attr.send_cq = qp_attr.recv_cq = s->cq;
	CHECK(s->qp = ibv_create_qp_ex(s->ctx, &qp_attr));
}

/* Polls one completion through the extended API. */
static void wait_ex(struct ibv_cq_ex *cx, uint64_t wr_id, enum ibv_wc_opcode op, uint32_t len)
{
	struct ibv_poll_cq_attr attr = { 0 };
	double t0 = now_s();
	long i = 0;

	while (ibv_start_poll(cx, &attr) == ENOENT)
		CHECK(waiting(t0, ++i));
	CHECK(cx->status == IBV_WC_SUCCESS && cx->wr_id == wr_id);
	CHECK(ibv_wc_read_opcode(cx) == op && ibv_wc_read_byte_len(cx) == len);
	ibv_end_poll(cx);
}

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	struct ibv_device_attr_ex dattr;
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);

	CHECK(list && n >= 2);
	setup_ex(&a, list[0]);
	setup_ex(&b, list[1]);
	CHECK(ibv_query_device_ex(a.ctx, NULL, &dattr) == 0);
	CHECK(dattr.orig_attr.max_qp_wr > 0 && dattr.orig_attr.phys_port_cnt == 1);
	/* The low 32 bits are device_cap_flags; above them, the raw packet offloads and (bits 38
	 * to 40, named in rdma-core 45's headers) RDMA FLUSH and ATOMIC WRITE. */
	CHECK((uint32_t)dattr.device_cap_flags_ex == dattr.orig_attr.device_cap_flags &&
	      dattr.phys_port_cnt_ex == 1);
	CHECK(dattr.device_cap_flags_ex >> 32 ==
	      ((IBV_DEVICE_RAW_SCATTER_FCS | IBV_DEVICE_PCI_WRITE_END_PADDING | 7ULL << 38) >> 32));
	/* Memory windows are claimed (as rxe), and XRC in the full profile. */
	CHECK((dattr.device_cap_flags_ex & (IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B)) ==
		      (IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B) &&
	      dattr.orig_attr.max_mw > 0);
	CHECK(dattr.device_cap_flags_ex & IBV_DEVICE_XRC);
	CHECK(dattr.max_wq_type_rq > 0 && dattr.max_dm_size == 256 * 1024);
	connect_to(&a, &b);
	connect_to(&b, &a);

	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(a.qp);
	CHECK(qx);

	/* A batch: SEND from an SGE, SEND_WITH_IMM of inline data, RDMA WRITE, FETCH_ADD. */
	struct ibv_sge rsge = { .addr = (uintptr_t)b.buf, .length = 64, .lkey = b.mr->lkey }, rsge2 = rsge;
	struct ibv_recv_wr rwr = { .wr_id = 100, .sg_list = &rsge, .num_sge = 1 }, rwr2 = rwr, *bad;
	rsge2.addr += 64;
	rwr2.wr_id = 101;
	rwr2.sg_list = &rsge2;
	CHECK(ibv_post_recv(b.qp, &rwr, &bad) == 0 && ibv_post_recv(b.qp, &rwr2, &bad) == 0);
	strcpy(a.buf, "via sge");
	*(uint64_t *)(b.buf + 1024) = 10;

	ibv_wr_start(qx);
	qx->wr_id = 1;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, a.mr->lkey, (uintptr_t)a.buf, 8);
	qx->wr_id = 2;
	ibv_wr_send_imm(qx, htobe32(77));
	ibv_wr_set_inline_data(qx, "inline!", 8);
	qx->wr_id = 3;
	ibv_wr_rdma_write(qx, b.mr->rkey, (uintptr_t)b.buf + 512);
	ibv_wr_set_sge(qx, a.mr->lkey, (uintptr_t)a.buf, 8);
	qx->wr_id = 4;
	ibv_wr_atomic_fetch_add(qx, b.mr->rkey, (uintptr_t)b.buf + 1024, 5);
	ibv_wr_set_sge(qx, a.mr->lkey, (uintptr_t)a.buf + 2048, 8);
	CHECK(ibv_wr_complete(qx) == 0);

	wait_ex(a.cqx, 1, IBV_WC_SEND, 8);
	wait_ex(a.cqx, 2, IBV_WC_SEND, 8);
	wait_ex(a.cqx, 3, IBV_WC_RDMA_WRITE, 8);
	wait_ex(a.cqx, 4, IBV_WC_FETCH_ADD, 8);
	{
		struct ibv_poll_cq_attr attr = { 0 };
		CHECK(ibv_start_poll(a.cqx, &attr) == ENOENT);
	}
	CHECK(strcmp(b.buf, "via sge") == 0 && strcmp(b.buf + 64, "inline!") == 0);
	CHECK(strcmp(b.buf + 512, "via sge") == 0);
	CHECK(*(uint64_t *)(a.buf + 2048) == 10 && *(uint64_t *)(b.buf + 1024) == 15);
	{
		struct ibv_cq_ex *cx = b.cqx;
		struct ibv_poll_cq_attr attr = { 0 };
		CHECK(ibv_start_poll(cx, &attr) == 0 && cx->wr_id == 100);
		CHECK(ibv_wc_read_opcode(cx) == IBV_WC_RECV && ibv_wc_read_byte_len(cx) == 8);
		CHECK(ibv_wc_read_qp_num(cx) == b.qp->qp_num);
		CHECK(ibv_next_poll(cx) == 0 && cx->wr_id == 101);
		CHECK((ibv_wc_read_wc_flags(cx) & IBV_WC_WITH_IMM) && be32toh(ibv_wc_read_imm_data(cx)) == 77);
		ibv_end_poll(cx);
	}

	/* ATOMIC WRITE: by ibv_wr_atomic_write (its 8 bytes copied at the call), and by
	 * ibv_post_send from an SGE. */
	{
		uint64_t v = 0x0102030405060708ull;
		ibv_wr_start(qx);
		qx->wr_id = 5;
		qx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_atomic_write(qx, b.mr->rkey, (uintptr_t)b.buf + 1032, &v);
		v = 0;
		CHECK(ibv_wr_complete(qx) == 0);
		wait_ex(a.cqx, 5, IBV_WC_ATOMIC_WRITE, 8);
		CHECK(*(uint64_t *)(b.buf + 1032) == 0x0102030405060708ull);
		*(uint64_t *)(a.buf + 3072) = 42;
		struct ibv_sge s8 = { .addr = (uintptr_t)a.buf + 3072, .length = 8, .lkey = a.mr->lkey };
		struct ibv_send_wr aw = { .wr_id = 6, .sg_list = &s8, .num_sge = 1,
					  .opcode = IBV_WR_ATOMIC_WRITE, .send_flags = IBV_SEND_SIGNALED,
					  .wr.rdma = { .remote_addr = (uintptr_t)b.buf + 1040, .rkey = b.mr->rkey } },
			*bad_aw;
		CHECK(ibv_post_send(a.qp, &aw, &bad_aw) == 0);
		wait_ex(a.cqx, 6, IBV_WC_ATOMIC_WRITE, 8);
		CHECK(*(uint64_t *)(b.buf + 1040) == 42);
		s8.length = 4;
		CHECK(ibv_post_send(a.qp, &aw, &bad_aw) == EINVAL && bad_aw == &aw);
	}

	/* Aborted batches post nothing; an oversized inline batch fails at complete. */
	ibv_wr_start(qx);
	qx->wr_id = 9;
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, a.mr->lkey, (uintptr_t)a.buf, 8);
	ibv_wr_abort(qx);
	{
		char big[4096] = { 0 };
		ibv_wr_start(qx);
		ibv_wr_send(qx);
		ibv_wr_set_inline_data(qx, big, sizeof(big));
		CHECK(ibv_wr_complete(qx) == ENOSPC);
	}
	/* TSO on an RC QP (it is for raw packet QPs) fails the batch, it does not crash. */
	ibv_wr_start(qx);
	{
		char hdr[64] = { 0 };
		ibv_wr_send_tso(qx, hdr, sizeof(hdr), 1024);
	}
	CHECK(ibv_wr_complete(qx) == EINVAL);
	{
		struct ibv_wc wc;
		CHECK(ibv_poll_cq(a.cq, 1, &wc) == 0);
	}
	/* The other queries of the device. */
	{
		struct ibv_gid_entry e, table[8];
		CHECK(ibv_get_device_index(list[1]) == 1);
		CHECK(ibv_query_gid_ex(a.ctx, 1, 0, &e, 0) == 0 && e.gid_index == 0 && e.port_num == 1);
		CHECK(memcmp(&e.gid, &a.gid, 16) == 0);
		CHECK(ibv_query_gid_ex(a.ctx, 1, 5, &e, 0) == ENODATA);
		ssize_t k = ibv_query_gid_table(a.ctx, table, 8, 0);
		CHECK(k >= 1 && memcmp(&table[0].gid, &a.gid, 16) == 0);
		CHECK(ibv_query_gid_table(a.ctx, table, 0, 0) < 0);
		struct ibv_mr *m = ibv_reg_mr_iova2(a.pd, a.buf, 64, 0x10000, IBV_ACCESS_LOCAL_WRITE);
		CHECK(m && m->addr == a.buf && m->length == 64);
		CHECK(ibv_dereg_mr(m) == 0);
	}

	/* What the emulator cannot do is refused, not faked. */
	{
		/* A completion field no device knows. */
		struct ibv_cq_init_attr_ex unknown = { .cqe = 4, .wc_flags = 1ULL << 20 };
		errno = 0;
		CHECK(ibv_create_cq_ex(a.ctx, &unknown) == NULL && errno == EOPNOTSUPP);
		struct ibv_qp_init_attr_ex bind = {
			.qp_type = IBV_QPT_RC, .send_cq = a.cq, .recv_cq = a.cq, .pd = a.pd,
			.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
			.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
			.send_ops_flags = IBV_QP_EX_WITH_TSO,
		};
		errno = 0;
		CHECK(ibv_create_qp_ex(a.ctx, &bind) == NULL && errno == EOPNOTSUPP);
		struct ibv_qp_init_attr plain = { .send_cq = a.cq, .recv_cq = a.cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 } };
		struct ibv_qp *p;
		CHECK(p = ibv_create_qp(a.pd, &plain));
		CHECK(ibv_qp_to_qp_ex(p) == NULL);
		CHECK(ibv_destroy_qp(p) == 0);
	}
	printf("extended ok\n");
	return 0;
}
