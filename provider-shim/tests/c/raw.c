/* Raw packet QPs, flow steering, receive WQs, RSS and TSO through the C ABI. With
 * RDMA_EMU_LINK_LAYER=ethernet (full profile) frames travel between two devices: steered by
 * ibv_create_flow, spread by an RSS QP's Toeplitz hash over WQs, cut by TSO; on InfiniBand
 * ports raw packet QPs are refused (EOPNOTSUPP), and on the rxe profile libibverbs refuses
 * every verb of the family, as on rxe. Prints "raw ok". */
#include "common.h"

static const uint8_t MAC_B[6] = { 0x02, 0, 0, 0, 0, 0xb };

/* Microsoft's RSS verification key. */
static uint8_t KEY[40] = { 0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67,
			   0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0, 0xd0, 0xca, 0x2b, 0xcb,
			   0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30,
			   0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa };

/* Ethernet + IPv4 + TCP, 54 bytes of headers then `len` payload bytes; checksums left 0. */
static int frame(char *f, const uint8_t src[4], uint16_t sport, const uint8_t dst[4],
		 uint16_t dport, int len)
{
	memset(f, 0, 54);
	memcpy(f, MAC_B, 6);
	f[6] = 0x02;
	f[12] = 0x08;
	f[14] = 0x45;
	f[16] = (uint8_t)((40 + len) >> 8);
	f[17] = (uint8_t)(40 + len);
	f[22] = 64;
	f[23] = 6;
	memcpy(f + 26, src, 4);
	memcpy(f + 30, dst, 4);
	f[34] = (char)(sport >> 8);
	f[35] = (char)sport;
	f[36] = (char)(dport >> 8);
	f[37] = (char)dport;
	f[46] = 0x50;
	f[47] = 0x18;
	for (int i = 0; i < len; i++)
		f[54 + i] = (char)(i % 251);
	return 54 + len;
}

static void to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL); /* the port is required */
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT) == 0);
	a.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);
	a.qp_state = IBV_QPS_RTS;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);
}

static struct ibv_qp *raw_qp(struct side *s, uint16_t max_tso_header)
{
	struct ibv_qp_init_attr_ex init = {
		.send_cq = s->cq,
		.recv_cq = s->cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 2 },
		.qp_type = IBV_QPT_RAW_PACKET,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS |
			     IBV_QP_INIT_ATTR_MAX_TSO_HEADER,
		.pd = s->pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_TSO,
		.max_tso_header = max_tso_header,
	};
	return ibv_create_qp_ex(s->ctx, &init);
}

struct rule {
	struct ibv_flow_attr attr;
	struct ibv_flow_spec_eth eth;
	struct ibv_flow_spec_ipv4 ip;
	struct ibv_flow_spec_tcp_udp tcp;
} __attribute__((packed, aligned(4)));

/* Frames to MAC_B; with `dport`, only TCP to that port. */
static struct rule mac_rule(uint16_t dport, uint16_t priority)
{
	struct rule r = {
		.attr = { .type = IBV_FLOW_ATTR_NORMAL, .size = sizeof(struct rule),
			  .priority = priority, .num_of_specs = dport ? 3 : 1, .port = 1 },
		.eth = { .type = IBV_FLOW_SPEC_ETH, .size = sizeof(struct ibv_flow_spec_eth) },
		.ip = { .type = IBV_FLOW_SPEC_IPV4, .size = sizeof(struct ibv_flow_spec_ipv4) },
		.tcp = { .type = IBV_FLOW_SPEC_TCP, .size = sizeof(struct ibv_flow_spec_tcp_udp),
			 .val.dst_port = htobe16(dport), .mask.dst_port = 0xffff },
	};
	memcpy(r.eth.val.dst_mac, MAC_B, 6);
	memset(r.eth.mask.dst_mac, 0xff, 6);
	return r;
}

static void post_frame_flags(struct side *s, struct ibv_qp *qp, int len, uint64_t id,
			     unsigned int flags)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf, .length = len, .lkey = s->mr->lkey };
	struct ibv_send_wr w = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED | flags };
	struct ibv_send_wr *bad;
	CHECK(ibv_post_send(qp, &w, &bad) == 0);
	struct ibv_wc wc = wait_wc(s->cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == id && wc.opcode == IBV_WC_SEND);
}

/* Sends the frame at the start of s->buf, the NIC filling in its checksums. */
static void post_frame(struct side *s, struct ibv_qp *qp, int len, uint64_t id)
{
	post_frame_flags(s, qp, len, id, IBV_SEND_IP_CSUM);
}

static void post_recv_at(struct side *s, struct ibv_qp *qp, int off, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf + off, .length = 1024, .lkey = s->mr->lkey };
	struct ibv_recv_wr w = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(qp, &w, &bad) == 0);
}

static struct ibv_wq *new_wq(struct side *s, struct ibv_cq *cq)
{
	struct ibv_wq_init_attr init = { .wq_type = IBV_WQT_RQ, .max_wr = 8, .max_sge = 1,
					 .pd = s->pd, .cq = cq };
	struct ibv_wq *wq;
	CHECK(wq = ibv_create_wq(s->ctx, &init));
	CHECK(init.max_wr == 8 && wq->state == IBV_WQS_RESET && wq->cq == cq);
	struct ibv_wq_attr a = { .attr_mask = IBV_WQ_ATTR_STATE, .wq_state = IBV_WQS_ERR };
	CHECK(ibv_modify_wq(wq, &a) == EINVAL); /* RESET -> ERR */
	a.wq_state = IBV_WQS_RDY;
	CHECK(ibv_modify_wq(wq, &a) == 0 && wq->state == IBV_WQS_RDY);
	return wq;
}

static void wq_recv(struct side *s, struct ibv_wq *wq, int off, int len, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf + off, .length = len, .lkey = s->mr->lkey };
	struct ibv_recv_wr w = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_wq_recv(wq, &w, &bad) == 0);
}

/* IEEE 802.3's CRC-32 of a frame, as the FCS after it carries it (least significant byte
 * first). */
static uint32_t crc32(const uint8_t *p, int n)
{
	uint32_t c = ~0u;
	for (int i = 0; i < n; i++) {
		c ^= p[i];
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0xedb88320u : c >> 1;
	}
	return ~c;
}

/* Receive offloads: a WQ that strips the C-VLAN tag (its TCI read through
 * ibv_wc_read_cvlan) and scatters the FCS, stripping switched off by ibv_modify_wq; a raw
 * packet QP created with IBV_QP_CREATE_SCATTER_FCS; a flow tag (ibv_wc_read_flow_tag); the
 * errors around them. */
static void offloads(struct side *a, struct side *b, struct ibv_qp *tx)
{
	struct ibv_device_attr_ex d;
	CHECK(ibv_query_device_ex(b->ctx, NULL, &d) == 0);
	CHECK(d.raw_packet_caps & IBV_RAW_PACKET_CAP_CVLAN_STRIPPING);
	CHECK(d.raw_packet_caps & IBV_RAW_PACKET_CAP_SCATTER_FCS);
	CHECK(d.raw_packet_caps & IBV_RAW_PACKET_CAP_DELAY_DROP);
	CHECK(d.device_cap_flags_ex & IBV_DEVICE_RAW_SCATTER_FCS);
	CHECK(d.device_cap_flags_ex & IBV_DEVICE_PCI_WRITE_END_PADDING);

	struct ibv_cq_init_attr_ex ci = { .cqe = 16, .wc_flags = IBV_WC_STANDARD_FLAGS |
							       IBV_WC_EX_WITH_CVLAN |
							       IBV_WC_EX_WITH_FLOW_TAG };
	struct ibv_cq_ex *cq;
	CHECK(cq = ibv_create_cq_ex(b->ctx, &ci));
	struct ibv_wq_init_attr wi = { .wq_type = IBV_WQT_RQ, .max_wr = 4, .max_sge = 1,
				       .pd = b->pd, .cq = ibv_cq_ex_to_cq(cq),
				       .comp_mask = IBV_WQ_INIT_ATTR_FLAGS,
				       .create_flags = IBV_WQ_FLAGS_RESERVED };
	errno = 0;
	CHECK(ibv_create_wq(b->ctx, &wi) == NULL && errno == EOPNOTSUPP);
	wi.create_flags = IBV_WQ_FLAGS_CVLAN_STRIPPING | IBV_WQ_FLAGS_SCATTER_FCS;
	struct ibv_wq *wq;
	CHECK(wq = ibv_create_wq(b->ctx, &wi));
	struct ibv_wq_attr wa = { .attr_mask = IBV_WQ_ATTR_STATE, .wq_state = IBV_WQS_RDY };
	CHECK(ibv_modify_wq(wq, &wa) == 0);
	struct ibv_rwq_ind_table_init_attr ti = { .log_ind_tbl_size = 0, .ind_tbl = &wq };
	struct ibv_rwq_ind_table *t;
	CHECK(t = ibv_create_rwq_ind_table(b->ctx, &ti));
	struct ibv_qp_init_attr_ex ri = {
		.qp_type = IBV_QPT_RAW_PACKET,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_IND_TABLE |
			     IBV_QP_INIT_ATTR_RX_HASH | IBV_QP_INIT_ATTR_CREATE_FLAGS,
		.pd = b->pd,
		.rwq_ind_tbl = t,
		.rx_hash_conf = { .rx_hash_function = IBV_RX_HASH_FUNC_TOEPLITZ,
				  .rx_hash_key_len = 40, .rx_hash_key = KEY },
		.create_flags = IBV_QP_CREATE_SCATTER_FCS,
	};
	errno = 0;
	CHECK(ibv_create_qp_ex(b->ctx, &ri) == NULL && errno == EINVAL); /* RSS: no flags */
	ri.comp_mask &= ~IBV_QP_INIT_ATTR_CREATE_FLAGS;
	struct ibv_qp *rss;
	CHECK(rss = ibv_create_qp_ex(b->ctx, &ri));
	struct rule r = mac_rule(0, 0);
	/* The RSS QP's rule tags the frames it takes (ibv_wc_read_flow_tag). */
	struct {
		struct ibv_flow_attr attr;
		struct ibv_flow_spec_eth eth;
		struct ibv_flow_spec_action_tag tag;
	} __attribute__((packed, aligned(4))) tr = {
		.attr = { .type = IBV_FLOW_ATTR_NORMAL, .size = sizeof(tr), .num_of_specs = 2,
			  .port = 1 },
		.eth = r.eth,
		.tag = { .type = IBV_FLOW_SPEC_ACTION_TAG,
			 .size = sizeof(struct ibv_flow_spec_action_tag), .tag_id = 1 << 24 },
	};
	struct ibv_flow *flow;
	errno = 0;
	CHECK(ibv_create_flow(rss, &tr.attr) == NULL && errno == EINVAL); /* 24-bit tags */
	tr.tag.tag_id = 0x123456;
	CHECK(flow = ibv_create_flow(rss, &tr.attr));

	/* A frame tagged PCP 5, VID 100, sent as it is. */
	uint8_t s1[4] = { 10, 0, 0, 1 }, s2[4] = { 10, 0, 0, 2 };
	char plain[128];
	int len = frame(plain, s1, 1, s2, 2, 30);
	memcpy(a->buf, plain, 12);
	memcpy(a->buf + 12, "\x81\x00\xa0\x64", 4);
	memcpy(a->buf + 16, plain + 12, len - 12);
	uint8_t fcs[4];
	uint32_t c = crc32((uint8_t *)a->buf, len + 4);
	for (int i = 0; i < 4; i++)
		fcs[i] = (uint8_t)(c >> (8 * i));
	for (int i = 0; i < 2; i++)
		wq_recv(b, wq, 256 * i, 256, 60 + i);
	post_frame_flags(a, tx, len + 4, 60, 0);
	struct ibv_poll_cq_attr pa = { 0 };
	while (ibv_start_poll(cq, &pa) == ENOENT)
		;
	CHECK(cq->status == IBV_WC_SUCCESS && cq->wr_id == 60);
	CHECK(ibv_wc_read_byte_len(cq) == (uint32_t)len + 4); /* the tag out, the FCS in */
	CHECK(ibv_wc_read_cvlan(cq) == 0xa064 && ibv_wc_read_qp_num(cq) == wq->wq_num);
	CHECK(ibv_wc_read_flow_tag(cq) == 0x123456);
	ibv_end_poll(cq);
	CHECK(memcmp(b->buf, plain, len) == 0 && memcmp(b->buf + len, fcs, 4) == 0);

	/* Stripping off: the next frame keeps its tag. */
	wa.attr_mask = IBV_WQ_ATTR_FLAGS;
	wa.flags = 0;
	wa.flags_mask = IBV_WQ_FLAGS_SCATTER_FCS;
	CHECK(ibv_modify_wq(wq, &wa) == EOPNOTSUPP); /* fixed at creation */
	wa.flags_mask = IBV_WQ_FLAGS_RESERVED;
	CHECK(ibv_modify_wq(wq, &wa) == EOPNOTSUPP);
	wa.flags_mask = IBV_WQ_FLAGS_CVLAN_STRIPPING;
	CHECK(ibv_modify_wq(wq, &wa) == 0);
	post_frame_flags(a, tx, len + 4, 61, 0);
	while (ibv_start_poll(cq, &pa) == ENOENT)
		;
	CHECK(cq->status == IBV_WC_SUCCESS && cq->wr_id == 61);
	CHECK(ibv_wc_read_byte_len(cq) == (uint32_t)len + 8 && ibv_wc_read_cvlan(cq) == 0);
	ibv_end_poll(cq);
	CHECK(memcmp(b->buf + 256, a->buf, len + 4) == 0 && memcmp(b->buf + 256 + len + 4, fcs, 4) == 0);
	CHECK(ibv_destroy_flow(flow) == 0);
	CHECK(ibv_destroy_qp(rss) == 0);
	CHECK(ibv_destroy_rwq_ind_table(t) == 0);
	CHECK(ibv_destroy_wq(wq) == 0);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);

	/* Create flags: receive offloads of raw packet QPs only. */
	struct ibv_qp_init_attr_ex qi = {
		.send_cq = b->cq,
		.recv_cq = b->cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS,
		.pd = b->pd,
		.create_flags = IBV_QP_CREATE_SCATTER_FCS,
	};
	errno = 0;
	CHECK(ibv_create_qp_ex(b->ctx, &qi) == NULL && errno == EOPNOTSUPP);
	qi.qp_type = IBV_QPT_RAW_PACKET;
	qi.create_flags = IBV_QP_CREATE_SOURCE_QPN;
	errno = 0;
	CHECK(ibv_create_qp_ex(b->ctx, &qi) == NULL && errno == EOPNOTSUPP);
	qi.create_flags = IBV_QP_CREATE_SCATTER_FCS;
	struct ibv_qp *rx;
	CHECK(rx = ibv_create_qp_ex(b->ctx, &qi));
	to_rts(rx);
	CHECK(flow = ibv_create_flow(rx, (struct ibv_flow_attr *)&r));
	post_recv_at(b, rx, 0, 62);
	post_frame_flags(a, tx, len + 4, 62, 0);
	struct ibv_wc wc = wait_wc(b->cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 62 && (int)wc.byte_len == len + 8);
	CHECK(memcmp(b->buf, a->buf, len + 4) == 0 && memcmp(b->buf + len + 4, fcs, 4) == 0);
	CHECK(ibv_destroy_flow(flow) == 0);
	CHECK(ibv_destroy_qp(rx) == 0);
}

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	struct ibv_device_attr_ex d;
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	const char *profile = getenv("RDMA_EMU_PROFILE");
	int rxe = profile && strcmp(profile, "rxe") == 0;

	CHECK(list && n >= 2);
	setup_base(&a, list[0]);
	setup_base(&b, list[1]);
	CHECK(a.cq = ibv_create_cq(a.ctx, 64, NULL, NULL, 0));
	CHECK(b.cq = ibv_create_cq(b.ctx, 64, NULL, NULL, 0));
	CHECK(ibv_query_device_ex(b.ctx, NULL, &d) == 0);
	struct ibv_wq_init_attr wq_init = { .wq_type = IBV_WQT_RQ, .max_wr = 8, .max_sge = 1,
					    .pd = b.pd, .cq = b.cq };
	if (rxe) {
		CHECK(d.max_wq_type_rq == 0 && d.rss_caps.supported_qpts == 0 && d.tso_caps.max_tso == 0);
		errno = 0;
		CHECK(ibv_create_wq(b.ctx, &wq_init) == NULL && errno == EOPNOTSUPP);
		errno = 0;
		CHECK(raw_qp(&b, 0) == NULL && errno == EOPNOTSUPP);
		CHECK(d.raw_packet_caps == 0 && !(d.device_cap_flags_ex & IBV_DEVICE_RAW_SCATTER_FCS));
		struct ibv_cq_init_attr_ex ci = { .cqe = 4, .wc_flags = IBV_WC_EX_WITH_CVLAN };
		errno = 0;
		CHECK(ibv_create_cq_ex(b.ctx, &ci) == NULL && errno == EOPNOTSUPP); /* as rxe */
		printf("raw ok\n");
		return 0;
	}
	CHECK(d.max_wq_type_rq > 0 && d.raw_packet_caps & IBV_RAW_PACKET_CAP_IP_CSUM);
	CHECK(d.rss_caps.supported_qpts & (1 << IBV_QPT_RAW_PACKET));
	CHECK(d.rss_caps.rx_hash_function == IBV_RX_HASH_FUNC_TOEPLITZ);
	CHECK(d.tso_caps.max_tso > 0 && d.tso_caps.supported_qpts & (1 << IBV_QPT_RAW_PACKET));
	CHECK(d.orig_attr.device_cap_flags & IBV_DEVICE_RAW_IP_CSUM);
	if (b.port.link_layer != IBV_LINK_LAYER_ETHERNET) {
		errno = 0;
		CHECK(raw_qp(&b, 0) == NULL && errno == EOPNOTSUPP);
		printf("raw ok\n");
		return 0;
	}

	/* A raw QP on each device; the receiver's flow takes TCP to port 80 for MAC_B. */
	struct ibv_qp *tx, *rx;
	/* The header is inlined into the send WQE, as on mlx5: 1024 bytes hold the control and
	 * Ethernet segments (48), the header rounded up to 16 and 16 per SGE (2 here). */
	CHECK(tx = raw_qp(&a, 944));
	CHECK(ibv_destroy_qp(tx) == 0);
	errno = 0;
	CHECK(raw_qp(&a, 945) == NULL && errno == EINVAL);
	CHECK(tx = raw_qp(&a, 64));
	CHECK(rx = raw_qp(&b, 0));
	to_rts(tx);
	to_rts(rx);
	struct rule r = mac_rule(80, 0);
	struct ibv_flow *flow;
	CHECK(flow = ibv_create_flow(rx, (struct ibv_flow_attr *)&r));
	struct rule bad = mac_rule(80, 16);
	errno = 0;
	CHECK(ibv_create_flow(rx, (struct ibv_flow_attr *)&bad) == NULL && errno == ENOMEM);
	bad = mac_rule(80, 0);
	bad.tcp.mask.dst_port = htobe16(0xff);
	bad.tcp.val.dst_port = htobe16(0x1ff);
	errno = 0;
	CHECK(ibv_create_flow(rx, (struct ibv_flow_attr *)&bad) == NULL && errno == EINVAL);
	bad = mac_rule(80, 0);
	bad.eth.size = 8;
	errno = 0;
	CHECK(ibv_create_flow(rx, (struct ibv_flow_attr *)&bad) == NULL && errno == EINVAL);
	/* A VXLAN specification, which the emulator does not match on. */
	struct {
		struct ibv_flow_attr attr;
		struct ibv_flow_spec_tunnel vxlan;
	} __attribute__((packed, aligned(4))) tunnel = {
		.attr = { .size = sizeof(tunnel), .num_of_specs = 1, .port = 1 },
		.vxlan = { .type = IBV_FLOW_SPEC_VXLAN_TUNNEL, .size = sizeof(struct ibv_flow_spec_tunnel) },
	};
	errno = 0;
	CHECK(ibv_create_flow(rx, (struct ibv_flow_attr *)&tunnel) == NULL && errno == EOPNOTSUPP);

	uint8_t s1[4] = { 10, 0, 0, 1 }, s2[4] = { 10, 0, 0, 2 };
	post_recv_at(&b, rx, 0, 1);
	int len = frame(a.buf, s1, 1000, s2, 80, 100);
	post_frame(&a, tx, len, 10);
	struct ibv_wc wc = wait_wc(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 1 && wc.opcode == IBV_WC_RECV);
	CHECK((int)wc.byte_len == len && wc.qp_num == rx->qp_num);
	CHECK(wc.wc_flags & IBV_WC_IP_CSUM_OK);
	CHECK(memcmp(b.buf + 54, a.buf + 54, 100) == 0 && memcmp(b.buf, a.buf, 24) == 0);
	/* Port 81: no rule takes it. */
	len = frame(a.buf, s1, 1000, s2, 81, 100);
	post_frame(&a, tx, len, 11);
	CHECK(ibv_poll_cq(b.cq, 1, &wc) == 0);

	/* TSO, through ibv_post_send and through ibv_wr_send_tso. */
	char hdr[54];
	frame(hdr, s1, 1000, s2, 80, 0);
	len = frame(a.buf, s1, 1000, s2, 80, 2500) - 54;
	memmove(a.buf, a.buf + 54, len);
	for (int i = 0; i < 6; i++)
		post_recv_at(&b, rx, 1024 + 1024 * (i % 3), 20 + i);
	struct ibv_sge sge = { .addr = (uintptr_t)a.buf, .length = len, .lkey = a.mr->lkey };
	struct ibv_send_wr w = { .wr_id = 30, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_TSO,
				 .send_flags = IBV_SEND_SIGNALED };
	w.tso.hdr = hdr;
	w.tso.hdr_sz = 54;
	w.tso.mss = 900; /* frames of 954 bytes fit the 1024-byte receives */
	struct ibv_send_wr *badw;
	CHECK(ibv_post_send(tx, &w, &badw) == 0);
	wc = wait_wc(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_TSO && wc.wr_id == 30);
	for (int i = 0; i < 3; i++) {
		wc = wait_wc(b.cq);
		int seg = i < 2 ? 900 : 700;
		CHECK(wc.status == IBV_WC_SUCCESS && (int)wc.byte_len == 54 + seg);
		CHECK(wc.wc_flags & IBV_WC_IP_CSUM_OK);
		char *got = b.buf + 1024 + 1024 * i;
		CHECK(memcmp(got + 54, a.buf + 900 * i, seg) == 0);
	}
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(tx);
	CHECK(qx);
	ibv_wr_start(qx);
	qx->wr_id = 31;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_tso(qx, hdr, 54, 900);
	ibv_wr_set_sge(qx, a.mr->lkey, (uintptr_t)a.buf, len);
	CHECK(ibv_wr_complete(qx) == 0);
	wc = wait_wc(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_TSO && wc.wr_id == 31);
	for (int i = 0; i < 3; i++)
		CHECK(wait_wc(b.cq).status == IBV_WC_SUCCESS);
	ibv_wr_start(qx);
	ibv_wr_send_tso(qx, hdr, 54, 0); /* no MSS */
	ibv_wr_set_sge(qx, a.mr->lkey, (uintptr_t)a.buf, len);
	CHECK(ibv_wr_complete(qx) == EINVAL);

	CHECK(ibv_destroy_qp(rx) == EBUSY); /* a flow steers to it */
	CHECK(ibv_destroy_flow(flow) == 0);
	CHECK(ibv_destroy_qp(rx) == 0);

	/* Receive WQs and an RSS QP over two of them. */
	wq_init.max_wr = 0;
	errno = 0;
	CHECK(ibv_create_wq(b.ctx, &wq_init) == NULL && errno == EINVAL);
	wq_init.max_wr = 8;
	wq_init.wq_type = 1;
	errno = 0;
	CHECK(ibv_create_wq(b.ctx, &wq_init) == NULL && errno == EINVAL);
	struct ibv_cq *cqs[2];
	struct ibv_wq *wqs[2];
	for (int i = 0; i < 2; i++) {
		CHECK(cqs[i] = ibv_create_cq(b.ctx, 16, NULL, NULL, 0));
		wqs[i] = new_wq(&b, cqs[i]);
		for (int k = 0; k < 4; k++)
			wq_recv(&b, wqs[i], 256 * (i * 4 + k), 256, i * 4 + k);
	}
	struct ibv_rwq_ind_table_init_attr ti = { .log_ind_tbl_size = 14, .ind_tbl = wqs };
	errno = 0;
	CHECK(ibv_create_rwq_ind_table(b.ctx, &ti) == NULL && errno == EINVAL);
	ti.log_ind_tbl_size = 1;
	struct ibv_rwq_ind_table *t;
	CHECK(t = ibv_create_rwq_ind_table(b.ctx, &ti));
	struct ibv_qp_init_attr_ex ri = {
		.qp_type = IBV_QPT_RAW_PACKET,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH,
		.pd = b.pd,
		.rwq_ind_tbl = t,
		.rx_hash_conf = { .rx_hash_function = IBV_RX_HASH_FUNC_TOEPLITZ,
				  .rx_hash_key_len = 39, .rx_hash_key = KEY,
				  .rx_hash_fields_mask = IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4 |
							 IBV_RX_HASH_SRC_PORT_TCP |
							 IBV_RX_HASH_DST_PORT_TCP },
	};
	errno = 0;
	CHECK(ibv_create_qp_ex(b.ctx, &ri) == NULL && errno == EINVAL); /* a 39-byte key */
	ri.rx_hash_conf.rx_hash_key_len = 40;
	struct ibv_qp *rss;
	CHECK(rss = ibv_create_qp_ex(b.ctx, &ri));
	CHECK(rss->qp_num == 0 && rss->recv_cq == NULL);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(rss, &qa, IBV_QP_STATE, &qi) == EOPNOTSUPP);
	struct rule rr = mac_rule(0, 0);
	CHECK(flow = ibv_create_flow(rss, (struct ibv_flow_attr *)&rr));
	/* (source, port, destination, port, IPv4 + TCP Toeplitz hash) of Microsoft's suite. */
	struct {
		uint8_t src[4];
		uint16_t sport;
		uint8_t dst[4];
		uint16_t dport;
		uint32_t hash;
	} cases[] = {
		{ { 66, 9, 149, 187 }, 2794, { 161, 142, 100, 80 }, 1766, 0x51ccc178 },
		{ { 199, 92, 111, 2 }, 14230, { 65, 69, 140, 83 }, 4739, 0xc626b0ea },
		{ { 24, 19, 198, 95 }, 12898, { 12, 22, 207, 184 }, 38024, 0x5c2b394a },
		{ { 38, 27, 205, 30 }, 48228, { 209, 142, 163, 6 }, 2217, 0xafc7327f },
		{ { 153, 39, 163, 191 }, 44251, { 202, 188, 127, 2 }, 1303, 0x10e828a2 },
	};
	int hits[2] = { 0, 0 };
	for (int c = 0; c < 5; c++) {
		len = frame(a.buf, cases[c].src, cases[c].sport, cases[c].dst, cases[c].dport, 10);
		post_frame(&a, tx, len, 40 + c);
		int i = cases[c].hash & 1;
		if (hits[i] == 4)
			continue; /* that WQ's receives are used up */
		wc = wait_wc(cqs[i]);
		CHECK(wc.status == IBV_WC_SUCCESS && wc.qp_num == wqs[i]->wq_num);
		CHECK((int)wc.byte_len == len && ibv_poll_cq(cqs[1 - i], 1, &wc) == 0);
		hits[i]++;
	}
	CHECK(hits[0] > 0 && hits[1] > 0);

	/* A receive too small for the frame: LOC_LEN_ERR, the WQ in ERR, IBV_EVENT_WQ_FATAL. */
	struct ibv_wq_attr wa = { .attr_mask = IBV_WQ_ATTR_STATE, .wq_state = IBV_WQS_RESET };
	for (int i = 0; i < 2; i++) {
		CHECK(ibv_modify_wq(wqs[i], &wa) == 0);
		wa.wq_state = IBV_WQS_RDY;
		CHECK(ibv_modify_wq(wqs[i], &wa) == 0);
		wa.wq_state = IBV_WQS_RESET;
		wq_recv(&b, wqs[i], 0, 16, 99);
	}
	len = frame(a.buf, cases[0].src, cases[0].sport, cases[0].dst, cases[0].dport, 10);
	post_frame(&a, tx, len, 50);
	int i0 = cases[0].hash & 1;
	wc = wait_wc(cqs[i0]);
	CHECK(wc.status == IBV_WC_LOC_LEN_ERR && wc.wr_id == 99);
	struct ibv_async_event ev;
	CHECK(ibv_get_async_event(b.ctx, &ev) == 0);
	CHECK(ev.event_type == IBV_EVENT_WQ_FATAL && ev.element.wq == wqs[i0]);
	ibv_ack_async_event(&ev);
	wa.attr_mask = IBV_WQ_ATTR_STATE | IBV_WQ_ATTR_CURR_STATE;
	wa.curr_wq_state = IBV_WQS_RDY;
	wa.wq_state = IBV_WQS_RESET;
	CHECK(ibv_modify_wq(wqs[i0], &wa) == EINVAL); /* it is in ERR */
	wa.curr_wq_state = IBV_WQS_ERR;
	CHECK(ibv_modify_wq(wqs[i0], &wa) == 0);

	/* Teardown in dependency order. */
	CHECK(ibv_destroy_wq(wqs[0]) == EBUSY);
	CHECK(ibv_destroy_rwq_ind_table(t) == EBUSY);
	CHECK(ibv_destroy_flow(flow) == 0);
	CHECK(ibv_destroy_qp(rss) == 0);
	CHECK(ibv_destroy_rwq_ind_table(t) == 0);
	for (int i = 0; i < 2; i++) {
		CHECK(ibv_destroy_wq(wqs[i]) == 0);
		CHECK(ibv_destroy_cq(cqs[i]) == 0);
	}
	offloads(&a, &b, tx);
	CHECK(ibv_destroy_qp(tx) == 0);
	printf("raw ok\n");
	return 0;
}
