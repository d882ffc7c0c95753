/* UD through the C ABI: address handles, a datagram with its 40-byte GRH area and src_qp,
 * Q_Key mismatch dropped, the AH keeping its PD busy. Prints "ok". */
#include "common.h"

#define QKEY 0x11111111

static struct ibv_qp *ud_qp(struct side *s)
{
	struct ibv_qp_init_attr init = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
	struct ibv_qp *qp;

	CHECK(qp = ibv_create_qp(s->pd, &init));
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0);
	a.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 1;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
	return qp;
}

static int send_to(struct side *a, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey, uint64_t id)
{
	struct ibv_sge sge = { (uintptr_t)a->buf, 9, a->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qpn;
	wr.wr.ud.remote_qkey = qkey;
	return ibv_post_send(a->qp, &wr, &bad);
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct side a = { 0 }, b = { 0 };
	struct ibv_wc wc;

	CHECK(list && n >= 2);
	setup(&a, list[0]);
	setup(&b, list[1]);
	CHECK(ibv_destroy_qp(a.qp) == 0 && ibv_destroy_qp(b.qp) == 0);
	a.qp = ud_qp(&a);
	b.qp = ud_qp(&b);

	struct ibv_ah_attr ah_attr = { .dlid = b.port.lid, .port_num = 1 };
	if (b.port.link_layer == IBV_LINK_LAYER_ETHERNET) {
		ah_attr.is_global = 1;
		ah_attr.grh.dgid = b.gid;
		ah_attr.grh.hop_limit = 1;
	}
	struct ibv_ah *ah = ibv_create_ah(a.pd, &ah_attr);
	CHECK(ah && ah->pd == a.pd);

	struct ibv_sge rsge = { (uintptr_t)b.buf, 40 + 64, b.mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &rsge, .num_sge = 1 }, *rbad;
	CHECK(ibv_post_recv(b.qp, &rwr, &rbad) == 0);
	strcpy(a.buf, "datagram");

	/* A wrong Q_Key is dropped; the right one is delivered after the GRH area. */
	CHECK(send_to(&a, ah, b.qp->qp_num, QKEY + 1, 1) == 0);
	wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS);
	CHECK(ibv_poll_cq(b.cq, 1, &wc) == 0);
	CHECK(send_to(&a, ah, b.qp->qp_num, QKEY, 2) == 0);
	wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 2 && wc.status == IBV_WC_SUCCESS);
	wc = wait_wc(b.cq);
	CHECK(wc.wr_id == 7 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV);
	CHECK(wc.byte_len == 40 + 9 && wc.src_qp == a.qp->qp_num);
	CHECK(strcmp(b.buf + 40, "datagram") == 0);

	/* Answer the sender with an AH built from the completion and the GRH area. */
	{
		struct ibv_ah_attr back;
		CHECK(ibv_init_ah_from_wc(b.ctx, 1, &wc, (struct ibv_grh *)b.buf, &back) == 0);
		CHECK(back.dlid == a.port.lid && back.port_num == 1);
		if (b.port.link_layer == IBV_LINK_LAYER_ETHERNET)
			CHECK(back.is_global && memcmp(&back.grh.dgid, &a.gid, 16) == 0);
		struct ibv_ah *reply = ibv_create_ah_from_wc(b.pd, &wc, (struct ibv_grh *)b.buf, 1);
		CHECK(reply);
		struct ibv_sge rs = { (uintptr_t)a.buf + 512, 64, a.mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = 8, .sg_list = &rs, .num_sge = 1 }, *rb;
		CHECK(ibv_post_recv(a.qp, &rw, &rb) == 0);
		strcpy(b.buf + 1024, "reply");
		struct ibv_sge ss = { (uintptr_t)b.buf + 1024, 6, b.mr->lkey };
		struct ibv_send_wr sw = { .wr_id = 9, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED }, *sb;
		sw.wr.ud.ah = reply;
		sw.wr.ud.remote_qpn = wc.src_qp;
		sw.wr.ud.remote_qkey = QKEY;
		CHECK(ibv_post_send(b.qp, &sw, &sb) == 0);
		CHECK(wait_wc(b.cq).status == IBV_WC_SUCCESS);
		struct ibv_wc r = wait_wc(a.cq);
		CHECK(r.wr_id == 8 && r.status == IBV_WC_SUCCESS && strcmp(a.buf + 512 + 40, "reply") == 0);
		CHECK(ibv_destroy_ah(reply) == 0);
	}

	/* RoCE v2: the GRH area is the packet's IP header. Between link-local GIDs an IPv6 header
	 * (next header UDP); between IPv4-mapped GIDs (index 1) 20 zero bytes and an IPv4 header.
	 * The answer's address comes out of either, as libibverbs reads them. */
	if (b.port.link_layer == IBV_LINK_LAYER_ETHERNET) {
		union ibv_gid a4, b4;
		struct ibv_ah_attr back;
		CHECK(b.buf[0] == 0x60 && b.buf[6] == 17);
		CHECK(ibv_query_gid(a.ctx, 1, 1, &a4) == 0 && ibv_query_gid(b.ctx, 1, 1, &b4) == 0);
		const char *profile = getenv("RDMA_EMU_PROFILE");
		int mlx5 = !profile || strcmp(profile, "rxe") != 0;
		struct ibv_ah_attr v4 = ah_attr;
		v4.grh.dgid = b4;
		v4.grh.sgid_index = 1;
		v4.grh.traffic_class = 0x28;
		struct ibv_ah *ah4 = ibv_create_ah(a.pd, &v4);
		CHECK(ah4);
		CHECK(ibv_post_recv(b.qp, &rwr, &rbad) == 0);
		CHECK(send_to(&a, ah4, b.qp->qp_num, QKEY, 3) == 0);
		CHECK(wait_wc(a.cq).status == IBV_WC_SUCCESS);
		wc = wait_wc(b.cq);
		CHECK(wc.status == IBV_WC_SUCCESS && (wc.wc_flags & IBV_WC_GRH));
		for (int i = 0; i < 20; i++)
			CHECK(b.buf[i] == 0);
		CHECK((unsigned char)b.buf[20] == 0x45 && b.buf[29] == 17); /* IPv4, 5 words; UDP */
		/* The AH's traffic class is the TOS; the route's TTL (64) replaced its hop limit. */
		CHECK(b.buf[21] == 0x28 && b.buf[28] == 64);
		/* mlx5 reports the network header type in sl (2: IPv4), rxe 0. */
		CHECK(wc.sl == (mlx5 ? 2 : 0));
		CHECK(memcmp(b.buf + 32, &a4.raw[12], 4) == 0 && memcmp(b.buf + 36, &b4.raw[12], 4) == 0);
		CHECK(ibv_init_ah_from_wc(b.ctx, 1, &wc, (struct ibv_grh *)b.buf, &back) == 0);
		CHECK(back.is_global && back.grh.sgid_index == 1 && back.grh.hop_limit == 64);
		CHECK(memcmp(&back.grh.dgid, &a4, 16) == 0);
		/* A header that is neither: EPROTONOSUPPORT; a GID we do not have: ENOENT. */
		b.buf[20] = 0x65;
		errno = 0;
		CHECK(ibv_init_ah_from_wc(b.ctx, 1, &wc, (struct ibv_grh *)b.buf, &back) == -1);
		CHECK(errno == EPROTONOSUPPORT);
		b.buf[20] = 0x45;
		b.buf[39] ^= 1; /* another destination address, with its checksum now wrong (ignored) */
		CHECK(ibv_init_ah_from_wc(b.ctx, 1, &wc, (struct ibv_grh *)b.buf, &back) == -1);
		CHECK(errno == ENOENT);
		CHECK(ibv_destroy_ah(ah4) == 0);
	}

	/* ibv_resolve_eth_l2_from_gid: b's MAC, which its GUID is the EUI-64 of (as on rxe), for
	 * either of its GIDs; group MACs for multicast GIDs; negative errnos otherwise. */
	{
		struct ibv_ah_attr r = { .is_global = 1, .port_num = 1 };
		uint8_t mac[6] = { 0 };
		uint16_t vid = 0;
		r.grh.dgid = b.gid;
		if (b.port.link_layer == IBV_LINK_LAYER_ETHERNET) {
			uint64_t g = be64toh(ibv_get_device_guid(list[1]));
			uint8_t want[6] = { (uint8_t)((g >> 56) ^ 2), g >> 48, g >> 40, g >> 16, g >> 8, g };
			CHECK(ibv_resolve_eth_l2_from_gid(a.ctx, &r, mac, &vid) == 0);
			CHECK(memcmp(mac, want, 6) == 0 && vid == 0xffff);
			r.grh.sgid_index = 1; /* IPv4 source, IPv6 destination */
			CHECK(ibv_resolve_eth_l2_from_gid(a.ctx, &r, mac, &vid) == -EINVAL);
			memset(mac, 0, 6);
			CHECK(ibv_query_gid(b.ctx, 1, 1, &r.grh.dgid) == 0);
			CHECK(ibv_resolve_eth_l2_from_gid(a.ctx, &r, mac, NULL) == 0);
			CHECK(memcmp(mac, want, 6) == 0);
			r.grh.dgid.raw[15] ^= 0x40; /* an address nobody has */
			CHECK(ibv_resolve_eth_l2_from_gid(a.ctx, &r, mac, &vid) == -EHOSTUNREACH);
			r.grh.dgid.raw[12] = 239; /* IPv4 multicast 239.x.y.z */
			CHECK(ibv_resolve_eth_l2_from_gid(a.ctx, &r, mac, &vid) == 0);
			CHECK(mac[0] == 1 && mac[1] == 0 && mac[2] == 0x5e && mac[3] == (r.grh.dgid.raw[13] & 0x7f));
			r.grh.sgid_index = 200; /* an empty GID: no interface has the source */
			CHECK(ibv_resolve_eth_l2_from_gid(a.ctx, &r, mac, &vid) == -EINVAL);
			r.port_num = 9; /* ibv_query_gid fails */
			CHECK(ibv_resolve_eth_l2_from_gid(a.ctx, &r, mac, &vid) == -1);
		} else {
			/* No netdev, no neighbours. */
			CHECK(ibv_resolve_eth_l2_from_gid(a.ctx, &r, mac, &vid) == -EINVAL);
		}
	}

	/* Multicast: b attaches to a group and receives what a sends to it. */
	{
		union ibv_gid mgid = { .raw = { 0xff, 0x12 } };
		struct ibv_ah_attr mattr = { .is_global = 1, .dlid = 0xc001, .port_num = 1 };
		mattr.grh.dgid = mgid;
		CHECK(ibv_attach_mcast(b.qp, &mgid, 0xc001) == 0);
		CHECK(ibv_attach_mcast(b.qp, &mgid, 0xc001) == 0); /* already: done, as uverbs */
		struct ibv_ah *mah = ibv_create_ah(a.pd, &mattr);
		CHECK(mah);
		struct ibv_sge rs = { (uintptr_t)b.buf + 2048, 40 + 64, b.mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = 11, .sg_list = &rs, .num_sge = 1 }, *rb;
		CHECK(ibv_post_recv(b.qp, &rw, &rb) == 0);
		CHECK(send_to(&a, mah, 0xffffff, QKEY, 12) == 0);
		CHECK(wait_wc(a.cq).wr_id == 12);
		struct ibv_wc m = wait_wc(b.cq);
		CHECK(m.wr_id == 11 && m.status == IBV_WC_SUCCESS && strcmp(b.buf + 2048 + 40, "datagram") == 0);
		CHECK(ibv_destroy_qp(b.qp) == EBUSY);
		CHECK(ibv_detach_mcast(b.qp, &mgid, 0xc001) == 0);
		CHECK(ibv_detach_mcast(b.qp, &mgid, 0xc001) == EINVAL);
		CHECK(ibv_destroy_ah(mah) == 0);
	}

	/* The same datagram through the ibv_wr_* API and ibv_wr_set_ud_addr. */
	{
		struct ibv_qp_init_attr_ex x = { .qp_type = IBV_QPT_UD, .send_cq = a.cq, .recv_cq = a.cq,
			.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
			.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = a.pd,
			.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM };
		struct ibv_qp_init_attr_ex rdma = x;
		rdma.send_ops_flags |= IBV_QP_EX_WITH_RDMA_WRITE; /* UD has no RDMA */
		CHECK(ibv_create_qp_ex(a.ctx, &rdma) == NULL && errno == EOPNOTSUPP);
		struct ibv_qp *xq = ibv_create_qp_ex(a.ctx, &x);
		CHECK(xq);
		struct ibv_qp_attr qa = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
		CHECK(ibv_modify_qp(xq, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0);
		qa.qp_state = IBV_QPS_RTR;
		CHECK(ibv_modify_qp(xq, &qa, IBV_QP_STATE) == 0);
		qa.qp_state = IBV_QPS_RTS;
		CHECK(ibv_modify_qp(xq, &qa, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
		struct ibv_sge rs = { (uintptr_t)b.buf + 1024, 40 + 64, b.mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = 21, .sg_list = &rs, .num_sge = 1 }, *rb;
		CHECK(ibv_post_recv(b.qp, &rw, &rb) == 0);
		struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(xq);
		ibv_wr_start(qx);
		qx->wr_id = 22;
		qx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send_imm(qx, htobe32(0x1234));
		ibv_wr_set_ud_addr(qx, ah, b.qp->qp_num, QKEY);
		ibv_wr_set_sge(qx, a.mr->lkey, (uintptr_t)a.buf, 9);
		CHECK(ibv_wr_complete(qx) == 0);
		CHECK(wait_wc(a.cq).wr_id == 22);
		struct ibv_wc w = wait_wc(b.cq);
		CHECK(w.wr_id == 21 && w.status == IBV_WC_SUCCESS && w.src_qp == xq->qp_num &&
		      (w.wc_flags & IBV_WC_WITH_IMM) && be32toh(w.imm_data) == 0x1234 && w.byte_len == 40 + 9);
		CHECK(strcmp(b.buf + 1024 + 40, "datagram") == 0);
		/* A UD WR without an address is taken, as rxe's builder takes it, and fails as it
		 * runs: a local QP operation error (the QP in ERR). */
		ibv_wr_start(qx);
		qx->wr_id = 23;
		qx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send(qx);
		ibv_wr_set_sge(qx, a.mr->lkey, (uintptr_t)a.buf, 9);
		CHECK(ibv_wr_complete(qx) == 0);
		struct ibv_wc bare = wait_wc(a.cq);
		CHECK(bare.wr_id == 23 && bare.status == IBV_WC_LOC_QP_OP_ERR);
		CHECK(ibv_destroy_qp(xq) == 0);
	}

	CHECK(ibv_dealloc_pd(a.pd) == EBUSY);
	CHECK(ibv_destroy_ah(ah) == 0);
	CHECK(ibv_destroy_ah(ah) == EINVAL);
	printf("ud ok\n");
	return 0;
}
