/* Tag matching through the C ABI (full profile, as an mlx5 HCA): tm_caps, a tag-matching SRQ,
 * ibv_post_srq_ops (add, remove, sync), eager messages matched into a tag's buffer, unexpected
 * and untagged messages into ordinary receives, the TM completions read through ibv_cq_ex.
 * The rxe profile (Linux 6.1) has no tag matching. */
#include <infiniband/tm_types.h>

#include "common.h"

static struct ibv_cq_ex *rcq;

/* Sends a message with a TMH of `op` and `tag` (app_ctx 9) then `body`, from a to b. */
static void send_tagged(struct side *a, uint8_t op, uint64_t tag, const char *body, uint64_t id)
{
	struct ibv_tmh h = { .opcode = op, .app_ctx = htobe32(9), .tag = htobe64(tag) };
	memcpy(a->buf, &h, sizeof(h));
	strcpy(a->buf + sizeof(h), body);
	struct ibv_sge sge = { (uintptr_t)a->buf, sizeof(h) + strlen(body), a->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	CHECK(ibv_post_send(a->qp, &wr, &bad) == 0);
	CHECK(wait_wc(a->cq).status == IBV_WC_SUCCESS);
}

struct tm_wc {
	uint64_t wr_id;
	int status, opcode;
	unsigned flags, len;
	struct ibv_wc_tm_info tm;
};

static struct tm_wc next_tm_wc(void)
{
	struct ibv_poll_cq_attr pa = { 0 };
	struct tm_wc w;
	double t0 = now_s();
	for (long i = 0; waiting(t0, i); i++) {
		int rc = ibv_start_poll(rcq, &pa);
		if (rc == ENOENT)
			continue;
		CHECK(rc == 0);
		w.wr_id = rcq->wr_id;
		w.status = rcq->status;
		w.opcode = ibv_wc_read_opcode(rcq);
		w.flags = ibv_wc_read_wc_flags(rcq);
		w.len = ibv_wc_read_byte_len(rcq);
		ibv_wc_read_tm_info(rcq, &w.tm);
		ibv_end_poll(rcq);
		return w;
	}
	CHECK(!"no completion");
	return w;
}

static int post_op(struct ibv_srq *srq, struct ibv_ops_wr *op)
{
	struct ibv_ops_wr *bad = NULL;
	int rc = ibv_post_srq_ops(srq, op, &bad);
	CHECK(rc == 0 || bad == op);
	return rc;
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	const char *profile = getenv("RDMA_EMU_PROFILE");
	int rxe = profile && strcmp(profile, "rxe") == 0;
	struct side a = { 0 }, b = { 0 };
	unsigned tm_flags = IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID | IBV_WC_TM_SYNC_REQ;

	CHECK(list && list[0] && list[1]);
	setup(&a, list[0]);
	setup(&b, list[1]);
	struct ibv_device_attr_ex dx;
	CHECK(ibv_query_device_ex(b.ctx, NULL, &dx) == 0);
	struct ibv_srq_init_attr_ex sa = {
		.attr = { .max_wr = 8, .max_sge = 1 }, .srq_type = IBV_SRQT_TM, .pd = b.pd, .cq = b.cq,
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ |
			     IBV_SRQ_INIT_ATTR_TM,
		.tm_cap = { .max_num_tags = 4, .max_ops = 8 },
	};
	if (rxe) {
		struct ibv_ops_wr op = { .opcode = IBV_WR_TAG_SYNC }, *bad;
		CHECK(dx.tm_caps.max_num_tags == 0);
		CHECK(!ibv_create_srq_ex(b.ctx, &sa) && errno == EOPNOTSUPP);
		struct ibv_srq_init_attr basic = { .attr = { .max_wr = 4, .max_sge = 1 } };
		struct ibv_srq *plain = ibv_create_srq(b.pd, &basic);
		CHECK(plain && ibv_post_srq_ops(plain, &op, &bad) == EOPNOTSUPP && bad == &op);
		printf("tm ok\n");
		return 0;
	}
	CHECK(dx.tm_caps.max_num_tags == 255 && dx.tm_caps.flags == IBV_TM_CAP_RC);
	CHECK(dx.tm_caps.max_sge == 1 && dx.tm_caps.max_rndv_hdr_size == 64 && dx.tm_caps.max_ops > 0);
	struct ibv_srq_init_attr_ex bad_attr = sa;
	bad_attr.tm_cap.max_num_tags = 256;
	CHECK(!ibv_create_srq_ex(b.ctx, &bad_attr) && errno == EINVAL);
	struct ibv_srq *srq = ibv_create_srq_ex(b.ctx, &sa);
	CHECK(srq);

	/* b's QP takes its receives from the SRQ; its completions carry the TM info. */
	struct ibv_cq_init_attr_ex ca = { .cqe = 16, .wc_flags = IBV_WC_STANDARD_FLAGS |
					  IBV_WC_EX_WITH_TM_INFO };
	CHECK(rcq = ibv_create_cq_ex(b.ctx, &ca));
	struct ibv_qp_init_attr qa = { .send_cq = b.cq, .recv_cq = ibv_cq_ex_to_cq(rcq), .srq = srq,
		.qp_type = IBV_QPT_RC, .cap = { .max_send_wr = 8, .max_send_sge = 1 } };
	CHECK(ibv_destroy_qp(b.qp) == 0);
	CHECK(b.qp = ibv_create_qp(b.pd, &qa));
	connect_to(&a, &b);
	connect_to(&b, &a);

	/* A tag, and two ordinary receives. */
	struct ibv_sge tsge = { (uintptr_t)b.buf, 64, b.mr->lkey };
	struct ibv_ops_wr add = { .wr_id = 1, .opcode = IBV_WR_TAG_ADD, .flags = IBV_OPS_SIGNALED };
	add.tm.add.recv_wr_id = 77;
	add.tm.add.sg_list = &tsge;
	add.tm.add.num_sge = 1;
	add.tm.add.tag = 0x1234;
	add.tm.add.mask = ~0ULL;
	add.tm.handle = 0xdead;
	CHECK(post_op(srq, &add) == 0 && add.tm.handle != 0xdead);
	struct ibv_wc wc = wait_wc(b.cq);
	CHECK(wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_TM_ADD);
	for (int i = 0; i < 3; i++) {
		struct ibv_sge s = { (uintptr_t)b.buf + 1024 * (i + 1), 64, b.mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = 50 + i, .sg_list = &s, .num_sge = 1 }, *rb;
		CHECK(ibv_post_srq_recv(srq, &rw, &rb) == 0);
	}

	/* Expected: in the tag's buffer, without the TMH. */
	send_tagged(&a, IBV_TMH_EAGER, 0x1234, "hello", 1);
	struct tm_wc w = next_tm_wc();
	CHECK(w.wr_id == 77 && w.status == IBV_WC_SUCCESS && w.opcode == IBV_WC_TM_RECV);
	CHECK((w.flags & tm_flags) == (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID) && w.len == 5);
	CHECK(w.tm.tag == 0x1234 && w.tm.priv == 9 && strcmp(b.buf, "hello") == 0);
	/* Unexpected: an ordinary receive takes it whole, TMH included. */
	send_tagged(&a, IBV_TMH_EAGER, 0x9999, "early", 2);
	w = next_tm_wc();
	CHECK(w.wr_id == 50 && w.opcode == IBV_WC_TM_RECV && (w.flags & tm_flags) == 0);
	CHECK(w.len == 16 + 5 && strcmp(b.buf + 1024 + 16, "early") == 0);
	/* Synced past it, a tag for it matches the next one. */
	struct ibv_ops_wr sync = { .wr_id = 2, .opcode = IBV_WR_TAG_ADD,
				   .flags = IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC };
	sync.tm = add.tm;
	sync.tm.unexpected_cnt = 1;
	sync.tm.add.tag = 0x9999;
	sync.tm.add.recv_wr_id = 78;
	CHECK(post_op(srq, &sync) == 0);
	wc = wait_wc(b.cq);
	CHECK(wc.wr_id == 2 && wc.opcode == IBV_WC_TM_ADD && !(wc.wc_flags & IBV_WC_TM_SYNC_REQ));
	send_tagged(&a, IBV_TMH_EAGER, 0x9999, "match", 3);
	w = next_tm_wc();
	CHECK(w.wr_id == 78 && (w.flags & IBV_WC_TM_MATCH) && w.tm.tag == 0x9999);
	/* No tag: an ordinary receive, IBV_WC_TM_NO_TAG. */
	send_tagged(&a, IBV_TMH_NO_TAG, 0, "plain", 4);
	w = next_tm_wc();
	CHECK(w.wr_id == 51 && w.opcode == IBV_WC_TM_NO_TAG);
	/* Rendezvous: the HCA reads the sender's buffer (named by the RVH) into the tag's, with a
	 * completion for the match and one for the data, and sends the sender a FIN. */
	struct ibv_ops_wr rndv_tag = add;
	rndv_tag.wr_id = 5;
	rndv_tag.tm.add.tag = 0x5555;
	rndv_tag.tm.add.recv_wr_id = 79;
	CHECK(post_op(srq, &rndv_tag) == 0);
	CHECK(wait_wc(b.cq).opcode == IBV_WC_TM_ADD);
	memset(b.buf, 0, 64);
	memset(a.buf + 2048, 0xab, 32);
	struct ibv_sge fs = { (uintptr_t)a.buf + 3072, 64, a.mr->lkey };
	struct ibv_recv_wr frw = { .wr_id = 90, .sg_list = &fs, .num_sge = 1 }, *frb;
	CHECK(ibv_post_recv(a.qp, &frw, &frb) == 0);
	struct ibv_rvh rvh = { .va = htobe64((uintptr_t)a.buf + 2048), .rkey = htobe32(a.mr->rkey),
			       .len = htobe32(32) };
	struct ibv_tmh h = { .opcode = IBV_TMH_RNDV, .app_ctx = htobe32(9), .tag = htobe64(0x5555) };
	memcpy(a.buf, &h, sizeof(h));
	memcpy(a.buf + sizeof(h), &rvh, sizeof(rvh));
	struct ibv_sge rs = { (uintptr_t)a.buf, sizeof(h) + sizeof(rvh), a.mr->lkey };
	struct ibv_send_wr rwr = { .wr_id = 6, .sg_list = &rs, .num_sge = 1, .opcode = IBV_WR_SEND,
				   .send_flags = IBV_SEND_SIGNALED }, *rbad;
	CHECK(ibv_post_send(a.qp, &rwr, &rbad) == 0);
	w = next_tm_wc();
	CHECK(w.wr_id == 79 && w.opcode == IBV_WC_TM_RECV && (w.flags & tm_flags) == IBV_WC_TM_MATCH);
	w = next_tm_wc();
	CHECK(w.wr_id == 79 && w.status == IBV_WC_SUCCESS && (w.flags & tm_flags) == IBV_WC_TM_DATA_VALID);
	CHECK(w.len == 32 && (unsigned char)b.buf[0] == 0xab && (unsigned char)b.buf[31] == 0xab);
	/* The sender: its SEND completes, and the FIN arrives (TMH opcode FIN, its app_ctx). */
	for (int n = 0; n < 2; n++) {
		wc = wait_wc(a.cq);
		CHECK(wc.status == IBV_WC_SUCCESS && (wc.wr_id == 6 || (wc.wr_id == 90 && wc.byte_len == 16)));
	}
	CHECK(a.buf[3072] == IBV_TMH_FIN && be32toh(*(uint32_t *)(a.buf + 3076)) == 9);

	/* Removing a consumed tag: IBV_WC_TM_ERR. An unknown opcode: EINVAL and bad_op. */
	struct ibv_ops_wr del = { .wr_id = 3, .opcode = IBV_WR_TAG_DEL, .flags = IBV_OPS_SIGNALED };
	del.tm.handle = add.tm.handle;
	CHECK(post_op(srq, &del) == 0);
	wc = wait_wc(b.cq);
	CHECK(wc.wr_id == 3 && wc.status == IBV_WC_TM_ERR);
	struct ibv_ops_wr junk = { .wr_id = 4, .opcode = 9 };
	CHECK(post_op(srq, &junk) == EINVAL);
	printf("tm ok\n");
	return 0;
}
