/* XRC through the C ABI: ibv_open_xrcd (private and by file), XRC SRQs by ibv_create_srq_ex and
 * ibv_get_srq_num, XRC_RECV QPs (no PD, no CQs) and XRC_SEND QPs (through ibv_create_qp_ex's
 * legacy path, as ibv_xsrq_pingpong makes them), the kernel's XRC transition masks, SENDs
 * and WRITEs naming SRQs by wr.qp_type.xrc.remote_srqn and ibv_wr_set_xrc_srqn, ibv_open_qp,
 * and the errors. Prints "xrc ok". */
#include <fcntl.h>
#include <unistd.h>

#include "common.h"

static void to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					   IBV_QP_ACCESS_FLAGS) == 0);
}

static void to_rtr(struct ibv_qp *qp, struct side *peer, uint32_t dest, int mask_extra)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dest,
				 .min_rnr_timer = 12, .ah_attr = { .dlid = peer->port.lid, .port_num = 1 } };
	if (peer->port.link_layer == IBV_LINK_LAYER_ETHERNET) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = peer->gid;
		a.ah_attr.grh.hop_limit = 1;
	}
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					   IBV_QP_RQ_PSN | mask_extra) == 0);
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct side a = { 0 }, b = { 0 };
	struct ibv_device_attr da;
	struct ibv_wc wc;
	char path[] = "/tmp/rdma-emu-xrc-XXXXXX";
	int fd = mkstemp(path);

	CHECK(list && n >= 2 && fd >= 0);
	setup_base(&a, list[0]);
	setup_base(&b, list[1]);
	CHECK(ibv_query_device(b.ctx, &da) == 0 && (da.device_cap_flags & IBV_DEVICE_XRC));
	CHECK(a.cq = ibv_create_cq(a.ctx, 16, NULL, NULL, 0));
	CHECK(b.cq = ibv_create_cq(b.ctx, 16, NULL, NULL, 0));

	/* Domains: attribute checks, sharing by file, O_EXCL. */
	struct ibv_xrcd_init_attr xa = { .comp_mask = IBV_XRCD_INIT_ATTR_FD, .fd = -1 };
	CHECK(ibv_open_xrcd(b.ctx, &xa) == NULL && errno == EINVAL);
	xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS | IBV_XRCD_INIT_ATTR_RESERVED;
	CHECK(ibv_open_xrcd(b.ctx, &xa) == NULL && errno == EOPNOTSUPP);
	xa = (struct ibv_xrcd_init_attr){ .comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
					  .fd = fd, .oflags = 0 };
	CHECK(ibv_open_xrcd(b.ctx, &xa) == NULL && errno == EAGAIN);
	xa.oflags = O_CREAT;
	struct ibv_xrcd *xrcd = ibv_open_xrcd(b.ctx, &xa);
	CHECK(xrcd && xrcd->context == b.ctx);
	struct ibv_xrcd *same = ibv_open_xrcd(b.ctx, &xa);
	CHECK(same);
	xa.oflags = O_CREAT | O_EXCL;
	CHECK(ibv_open_xrcd(b.ctx, &xa) == NULL && errno == EINVAL);
	xa.fd = 12345;
	CHECK(ibv_open_xrcd(b.ctx, &xa) == NULL && errno == EBADF);

	/* An XRC SRQ needs TYPE | PD | XRCD | CQ. */
	struct ibv_srq_init_attr_ex sa = { .attr = { .max_wr = 8, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD,
		.srq_type = IBV_SRQT_XRC, .pd = b.pd, .xrcd = xrcd, .cq = b.cq };
	CHECK(ibv_create_srq_ex(b.ctx, &sa) == NULL && errno == EINVAL);
	sa.comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
	struct ibv_srq *srq = ibv_create_srq_ex(b.ctx, &sa);
	CHECK(srq && sa.attr.max_wr >= 8);
	uint32_t srqn;
	CHECK(ibv_get_srq_num(srq, &srqn) == 0);
	for (int i = 0; i < 4; i++) {
		struct ibv_sge s = { (uintptr_t)b.buf + 64 * i, 64, b.mr->lkey };
		struct ibv_recv_wr r = { .wr_id = 100 + i, .sg_list = &s, .num_sge = 1 }, *bad;
		CHECK(ibv_post_srq_recv(srq, &r, &bad) == 0);
	}

	/* The target QP: made in the domain, with no PD or CQ. */
	struct ibv_qp_init_attr_ex ta = { .qp_type = IBV_QPT_XRC_RECV, .comp_mask = IBV_QP_INIT_ATTR_XRCD,
					  .xrcd = xrcd };
	struct ibv_qp *tgt = ibv_create_qp_ex(b.ctx, &ta);
	CHECK(tgt && tgt->pd == NULL && tgt->send_cq == NULL && tgt->qp_type == IBV_QPT_XRC_RECV);
	/* The initiator, through the legacy create path (comp_mask == PD), without a recv CQ. */
	struct ibv_qp_init_attr_ex ia = { .qp_type = IBV_QPT_XRC_SEND, .send_cq = a.cq,
		.cap = { .max_send_wr = 8, .max_send_sge = 1 }, .comp_mask = IBV_QP_INIT_ATTR_PD, .pd = a.pd };
	struct ibv_qp *ini = ibv_create_qp_ex(a.ctx, &ia);
	CHECK(ini && ia.cap.max_recv_wr == 0);

	to_init(tgt);
	to_init(ini);
	/* A target needs the responder attributes at RTR, an initiator does not. */
	{
		struct ibv_qp_attr bad = { .qp_state = IBV_QPS_RTR };
		CHECK(ibv_modify_qp(tgt, &bad, IBV_QP_STATE | IBV_QP_AV) == EINVAL);
	}
	to_rtr(tgt, &a, ini->qp_num, IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	to_rtr(ini, &b, tgt->qp_num, 0);
	{
		struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7,
					 .max_rd_atomic = 1 };
		CHECK(ibv_modify_qp(tgt, &r, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN) == 0);
		CHECK(ibv_modify_qp(ini, &r, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN | IBV_QP_RETRY_CNT |
						     IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
	}
	{
		struct ibv_recv_wr r = { .wr_id = 1 }, *bad;
		CHECK(ibv_post_recv(ini, &r, &bad) == EINVAL && bad == &r);
	}

	/* SEND naming the SRQ: the completion is on the SRQ's CQ, with the target's QPN. */
	strcpy(a.buf, "xrc!");
	struct ibv_sge s = { (uintptr_t)a.buf, 5, a.mr->lkey };
	struct ibv_send_wr w = { .wr_id = 7, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED }, *bad;
	w.qp_type.xrc.remote_srqn = srqn;
	CHECK(ibv_post_send(ini, &w, &bad) == 0);
	wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 7 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND);
	wc = wait_wc(b.cq);
	CHECK(wc.wr_id == 100 && wc.status == IBV_WC_SUCCESS && wc.qp_num == tgt->qp_num && wc.byte_len == 5);
	CHECK(strcmp(b.buf, "xrc!") == 0);
	/* A WRITE through the target, checked against the SRQ's PD. */
	w.opcode = IBV_WR_RDMA_WRITE;
	w.wr.rdma.remote_addr = (uintptr_t)b.buf + 1024;
	w.wr.rdma.rkey = b.mr->rkey;
	CHECK(ibv_post_send(ini, &w, &bad) == 0);
	CHECK(wait_wc(a.cq).status == IBV_WC_SUCCESS && strcmp(b.buf + 1024, "xrc!") == 0);

	/* ibv_open_qp: another handle on the target; the QP lives on until both are destroyed. */
	struct ibv_qp_open_attr oa = { .comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD |
						    IBV_QP_OPEN_ATTR_TYPE,
				       .qp_num = tgt->qp_num, .xrcd = xrcd, .qp_type = IBV_QPT_XRC_RECV };
	struct ibv_qp *opened = ibv_open_qp(b.ctx, &oa);
	CHECK(opened && opened->qp_num == tgt->qp_num && opened->pd == NULL);
	oa.qp_type = IBV_QPT_RC;
	CHECK(ibv_open_qp(b.ctx, &oa) == NULL && errno == EINVAL);
	oa.qp_type = IBV_QPT_XRC_RECV;
	oa.qp_num = 0xabcdef;
	CHECK(ibv_open_qp(b.ctx, &oa) == NULL && errno == EINVAL);
	CHECK(ibv_destroy_qp(tgt) == 0);

	/* The same through the ibv_wr_* API on an extended initiator. */
	{
		struct ibv_qp_init_attr_ex x = ia;
		x.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		x.send_ops_flags = IBV_QP_EX_WITH_SEND;
		struct ibv_qp *ini2 = ibv_create_qp_ex(a.ctx, &x);
		CHECK(ini2);
		struct ibv_qp *tgt2 = ibv_create_qp_ex(b.ctx, &ta);
		CHECK(tgt2);
		to_init(tgt2);
		to_init(ini2);
		to_rtr(tgt2, &a, ini2->qp_num, IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
		to_rtr(ini2, &b, tgt2->qp_num, 0);
		struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7 };
		CHECK(ibv_modify_qp(tgt2, &r, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN) == 0);
		CHECK(ibv_modify_qp(ini2, &r, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN | IBV_QP_RETRY_CNT |
						      IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
		struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(ini2);
		ibv_wr_start(qx);
		qx->wr_id = 8;
		qx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send(qx);
		ibv_wr_set_xrc_srqn(qx, srqn);
		ibv_wr_set_sge(qx, a.mr->lkey, (uintptr_t)a.buf, 5);
		CHECK(ibv_wr_complete(qx) == 0);
		CHECK(wait_wc(a.cq).wr_id == 8);
		wc = wait_wc(b.cq);
		CHECK(wc.wr_id == 101 && wc.status == IBV_WC_SUCCESS && wc.qp_num == tgt2->qp_num);
		CHECK(ibv_destroy_qp(ini2) == 0 && ibv_destroy_qp(tgt2) == 0);
	}

	/* Teardown order: the domain is busy while its SRQ and target QP exist. */
	CHECK(ibv_close_xrcd(same) == 0); /* one of the two opens */
	CHECK(ibv_close_xrcd(xrcd) == EBUSY);
	CHECK(ibv_destroy_qp(opened) == 0);
	CHECK(ibv_destroy_qp(ini) == 0);
	CHECK(ibv_destroy_srq(srq) == 0);
	CHECK(ibv_close_xrcd(xrcd) == 0);
	close(fd);
	unlink(path);
	printf("xrc ok\n");
	return 0;
}
