/* One process, two emulated devices, two connected RC QPs: SEND/RECV (with immediate data),
 * RDMA WRITE/READ, both atomics, completion events through a channel and poll(2), and the
 * errnos of bad input. Compiled against the system's <infiniband/verbs.h> and linked with
 * -libverbs, so every inline verb is the real inline code. Exits 0 and prints "ok". */
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>

#include "common.h"

static int post(struct side *s, enum ibv_wr_opcode op, uint64_t id, uint32_t off, uint32_t len,
		struct side *peer, uint32_t roff)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf + off, .length = len, .lkey = s->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;

	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
		wr.wr.atomic.remote_addr = (uintptr_t)peer->buf + roff;
		wr.wr.atomic.rkey = peer->mr->rkey;
	} else if (peer) {
		wr.wr.rdma.remote_addr = (uintptr_t)peer->buf + roff;
		wr.wr.rdma.rkey = peer->mr->rkey;
	}
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD)
		wr.wr.atomic.compare_add = 5;
	if (op == IBV_WR_ATOMIC_CMP_AND_SWP) {
		wr.wr.atomic.compare_add = 47;
		wr.wr.atomic.swap = 1000;
	}
	if (op == IBV_WR_SEND_WITH_IMM)
		wr.imm_data = htonl(0x1234);
	return ibv_post_send(s->qp, &wr, &bad);
}

static void post_recv(struct side *s, uint64_t id, uint32_t off, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf + off, .length = len, .lkey = s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(s->qp, &wr, &bad) == 0);
}

/* RoCE resolves a path's destination when an AH is made or a QP given a path, as the kernel
 * does: a GID no port owns times out (neighbour resolution), mixed IP families are EINVAL,
 * multicast needs no lookup. */
static void roce_routes(struct side *a, struct side *b)
{
	struct ibv_qp_init_attr init = { .send_cq = a->cq, .recv_cq = a->cq, .qp_type = IBV_QPT_RC,
					 .cap = { .max_send_wr = 1, .max_recv_wr = 1,
						  .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	union ibv_gid v4;
	struct ibv_qp *qp;
	struct ibv_ah *ah;
	int v4_index = -1;

	for (int i = 0; i < 4 && v4_index < 0; i++)
		if (ibv_query_gid(b->ctx, 1, i, &v4) == 0 && v4.raw[10] == 0xff && v4.raw[11] == 0xff)
			v4_index = i;
	CHECK(v4_index >= 0);
	CHECK(qp = ibv_create_qp(a->pd, &init));
	CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						IBV_QP_ACCESS_FLAGS) == 0);
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTR;
	attr.path_mtu = IBV_MTU_1024;
	attr.dest_qp_num = b->qp->qp_num;
	attr.max_dest_rd_atomic = 1;
	attr.ah_attr.is_global = 1;
	attr.ah_attr.port_num = 1;
	attr.ah_attr.grh.hop_limit = 64;
	attr.ah_attr.grh.sgid_index = v4_index;
	/* An IPv4 address nobody on the fabric has (TEST-NET-3). */
	CHECK(inet_pton(AF_INET6, "::ffff:203.0.113.9", attr.ah_attr.grh.dgid.raw) == 1);
	CHECK(ibv_modify_qp(qp, &attr, rtr) == ETIMEDOUT);
	CHECK(!ibv_create_ah(a->pd, &attr.ah_attr) && errno == ETIMEDOUT);
	/* The peer's link-local GID from an IPv4 source. */
	attr.ah_attr.grh.dgid = b->gid;
	CHECK(ibv_modify_qp(qp, &attr, rtr) == EINVAL);
	CHECK(!ibv_create_ah(a->pd, &attr.ah_attr) && errno == EINVAL);
	/* A multicast group: no neighbour to resolve. */
	CHECK(inet_pton(AF_INET6, "::ffff:239.1.2.3", attr.ah_attr.grh.dgid.raw) == 1);
	CHECK(ah = ibv_create_ah(a->pd, &attr.ah_attr));
	CHECK(ibv_destroy_ah(ah) == 0);
	/* The peer's IPv4 GID resolves. */
	attr.ah_attr.grh.dgid = v4;
	CHECK(ibv_modify_qp(qp, &attr, rtr) == 0 && qp->state == IBV_QPS_RTR);
	CHECK(ibv_destroy_qp(qp) == 0);
}

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	struct ibv_wc wc;
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);

	CHECK(list && n >= 2);
	CHECK(strcmp(ibv_get_device_name(list[0]), "emu0") == 0);
	CHECK(ibv_get_device_guid(list[0]) != 0);
	setup(&a, list[0]);
	setup(&b, list[1]);
	connect_to(&a, &b);
	connect_to(&b, &a);

	/* SEND / RECV with immediate data. */
	strcpy(a.buf, "hello from a");
	post_recv(&b, 7, 1024, 64);
	CHECK(post(&a, IBV_WR_SEND_WITH_IMM, 1, 0, 13, NULL, 0) == 0);
	wc = wait_wc(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 1 && wc.opcode == IBV_WC_SEND && wc.byte_len == 13);
	wc = wait_wc(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 7 && wc.opcode == IBV_WC_RECV);
	CHECK(wc.byte_len == 13 && (wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == 0x1234);
	CHECK(wc.qp_num == b.qp->qp_num);
	CHECK(strcmp(b.buf + 1024, "hello from a") == 0);

	/* RDMA WRITE, then READ it back elsewhere. */
	for (int i = 0; i < 256; i++)
		a.buf[2048 + i] = (char)i;
	CHECK(post(&a, IBV_WR_RDMA_WRITE, 2, 2048, 256, &b, 0) == 0);
	wc = wait_wc(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE);
	CHECK(memcmp(a.buf + 2048, b.buf, 256) == 0);
	CHECK(post(&b, IBV_WR_RDMA_READ, 3, 512, 256, &a, 2048) == 0);
	wc = wait_wc(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ && wc.byte_len == 256);
	CHECK(memcmp(b.buf + 512, a.buf + 2048, 256) == 0);

	/* Atomics on b.buf[3072]. */
	*(uint64_t *)(b.buf + 3072) = 42;
	CHECK(post(&a, IBV_WR_ATOMIC_FETCH_AND_ADD, 4, 3584, 8, &b, 3072) == 0);
	wc = wait_wc(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_FETCH_ADD);
	CHECK(*(uint64_t *)(a.buf + 3584) == 42 && *(uint64_t *)(b.buf + 3072) == 47);
	CHECK(post(&a, IBV_WR_ATOMIC_CMP_AND_SWP, 5, 3584, 8, &b, 3072) == 0);
	wc = wait_wc(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_COMP_SWAP);
	CHECK(*(uint64_t *)(a.buf + 3584) == 47 && *(uint64_t *)(b.buf + 3072) == 1000);

	/* Completion events: arm, complete, poll(2) on the channel fd, get and ack the event. */
	{
		struct pollfd pfd = { .fd = b.ch->fd, .events = POLLIN };
		struct ibv_cq *ev_cq;
		void *ev_ctx;

		CHECK(ibv_req_notify_cq(b.cq, 0) == 0);
		CHECK(poll(&pfd, 1, 0) == 0);
		post_recv(&b, 8, 1024, 64);
		CHECK(post(&a, IBV_WR_SEND, 6, 0, 4, NULL, 0) == 0);
		CHECK(poll(&pfd, 1, 5000) == 1 && (pfd.revents & POLLIN));
		CHECK(ibv_get_cq_event(b.ch, &ev_cq, &ev_ctx) == 0);
		CHECK(ev_cq == b.cq && ev_ctx == &b);
		ibv_ack_cq_events(ev_cq, 1);
		wc = wait_wc(b.cq);
		CHECK(wc.wr_id == 8 && wc.status == IBV_WC_SUCCESS);
		wc = wait_wc(a.cq);
		CHECK(wc.wr_id == 6);
	}

	/* Bad input gets rdma-core's errnos. */
	{
		struct ibv_sge sge = { .addr = (uintptr_t)a.buf, .length = 8, .lkey = a.mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 9, .sg_list = &sge, .num_sge = 100,
					  .opcode = IBV_WR_SEND }, *bad = NULL;
		struct ibv_qp_attr attr = { .qp_state = IBV_QPS_RTR };

		CHECK(ibv_post_send(a.qp, &wr, &bad) == EINVAL && bad == &wr);
		/* A refused destroy leaves its error in errno too, as the failed kernel command. */
		errno = 0;
		CHECK(ibv_dealloc_pd(a.pd) == EBUSY && errno == EBUSY);
		errno = 0;
		CHECK(ibv_reg_mr(a.pd, a.buf, 64, IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL);
		errno = 0;
		CHECK(ibv_create_cq(a.ctx, 0, NULL, NULL, 0) == NULL && errno == EINVAL);
		/* NULL is unmapped memory like any other: the kernel's pinning fails (rxe, mlx5). */
		errno = 0;
		CHECK(ibv_reg_mr(a.pd, NULL, 4096, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EFAULT);
		/* A CQ without a channel is armed as any (rxe and mlx5 take it): nothing comes of it. */
		{
			struct ibv_cq *lone = ibv_create_cq(a.ctx, 4, NULL, NULL, 0);
			CHECK(lone && ibv_req_notify_cq(lone, 0) == 0 && ibv_req_notify_cq(lone, 1) == 0);
			CHECK(ibv_destroy_cq(lone) == 0);
		}
		/* Queries past the device leave their reason in errno, as libibverbs' (rxe). */
		{
			struct ibv_port_attr pa;
			union ibv_gid g;
			uint16_t pkey;
			errno = 0;
			CHECK(ibv_query_port(a.ctx, 9, &pa) == EINVAL && errno == EINVAL);
			errno = 0;
			CHECK(ibv_query_gid(a.ctx, 9, 0, &g) == -1 && errno == EINVAL);
			errno = 0;
			CHECK(ibv_query_pkey(a.ctx, 1, 4000, &pkey) == -1 && errno == ENOENT);
			errno = 0;
			CHECK(ibv_get_pkey_index(a.ctx, 1, htons(0x1234)) == -1 && errno == ENOENT);
			errno = 0;
			CHECK(ibv_resize_cq(a.cq, 0) == EINVAL && errno == EINVAL);
		}
		/* ibv_create_cq_ex's flags and masks as each provider reads them: rxe's refuses
		 * only what reaches its kernel (IGNORE_OVERRUN, which the emulator cannot grant
		 * either), mlx5's whatever it does not know (EINVAL) and a PD that is no parent
		 * domain. */
		{
			const char *pf = getenv("RDMA_EMU_PROFILE");
			int on_rxe = pf && strcmp(pf, "rxe") == 0;
			struct ibv_cq_init_attr_ex x = { .cqe = 4, .wc_flags = IBV_WC_STANDARD_FLAGS,
				.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS,
				.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED };
			struct ibv_cq_ex *cx = ibv_create_cq_ex(a.ctx, &x);
			CHECK(cx && ibv_destroy_cq(ibv_cq_ex_to_cq(cx)) == 0);
			x.flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
			errno = 0;
			CHECK(!ibv_create_cq_ex(a.ctx, &x) && errno == EOPNOTSUPP);
			x.flags = 1 << 7;
			errno = 0;
			cx = ibv_create_cq_ex(a.ctx, &x);
			CHECK(on_rxe ? cx && ibv_destroy_cq(ibv_cq_ex_to_cq(cx)) == 0 : !cx && errno == EINVAL);
			x.flags = 0;
			x.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
			x.parent_domain = a.pd;
			errno = 0;
			cx = ibv_create_cq_ex(a.ctx, &x);
			CHECK(on_rxe ? cx && ibv_destroy_cq(ibv_cq_ex_to_cq(cx)) == 0 : !cx && errno == EINVAL);
			x.comp_mask = 1 << 4;
			errno = 0;
			CHECK(!ibv_create_cq_ex(a.ctx, &x) && errno == (on_rxe ? EOPNOTSUPP : EINVAL));
		}
		CHECK(ibv_destroy_comp_channel(a.ch) == EBUSY);
		CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == EINVAL);
		CHECK(strcmp(ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR), "remote access error") == 0);
		CHECK(strcmp(ibv_event_type_str(IBV_EVENT_QP_ACCESS_ERR),
			     "local access violation work queue error") == 0);
	}

	/* A bad rkey: REM_ACCESS_ERR, then the QP is in ERR and later WRs flush. */
	{
		struct ibv_sge sge = { .addr = (uintptr_t)a.buf, .length = 8, .lkey = a.mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 10, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_RDMA_WRITE }, *bad;
		struct ibv_qp_attr qattr;
		struct ibv_qp_init_attr qinit;
		struct ibv_async_event ev;

		wr.wr.rdma.remote_addr = (uintptr_t)b.buf;
		wr.wr.rdma.rkey = b.mr->rkey ^ 0x100;
		CHECK(ibv_post_send(a.qp, &wr, &bad) == 0);
		wc = wait_wc(a.cq);
		CHECK(wc.wr_id == 10 && wc.status == IBV_WC_REM_ACCESS_ERR);
		CHECK(ibv_query_qp(a.qp, &qattr, IBV_QP_STATE, &qinit) == 0);
		CHECK(qattr.qp_state == IBV_QPS_ERR && qinit.send_cq == a.cq);
		const char *profile = getenv("RDMA_EMU_PROFILE");
		if (profile && strcmp(profile, "rxe") == 0) {
			/* Like rxe, the rxe profile raises no QP error event: nothing is pending. */
			int fl = fcntl(b.ctx->async_fd, F_GETFL);
			CHECK(fcntl(b.ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0);
			CHECK(ibv_get_async_event(b.ctx, &ev) == -1 && errno == EAGAIN);
		} else {
			/* The responder raised QP_ACCESS_ERR on b's QP (IBA 11.6.3). */
			CHECK(ibv_get_async_event(b.ctx, &ev) == 0);
			CHECK(ev.event_type == IBV_EVENT_QP_ACCESS_ERR && ev.element.qp == b.qp);
			ibv_ack_async_event(&ev);
		}
	}

	if (a.port.link_layer == IBV_LINK_LAYER_ETHERNET)
		roce_routes(&a, &b);

	/* P_Key lookup and rereg. */
	CHECK(ibv_get_pkey_index(a.ctx, 1, htons(0xffff)) == 0);
	CHECK(ibv_get_pkey_index(a.ctx, 1, htons(0x1234)) == -1);
	{
		const char *profile = getenv("RDMA_EMU_PROFILE");
		int rc = ibv_rereg_mr(a.mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE);
		if (profile && strcmp(profile, "rxe") == 0) {
			CHECK(rc == IBV_REREG_MR_ERR_CMD && errno == EOPNOTSUPP); /* as rdma-core on rxe */
		} else {
			CHECK(rc == 0 && a.mr->rkey == a.mr->lkey); /* mlx5: rkey = lkey always */
		}
	}

	CHECK(ibv_destroy_qp(a.qp) == 0 && ibv_destroy_qp(b.qp) == 0);
	CHECK(ibv_destroy_cq(a.cq) == 0 && ibv_destroy_cq(b.cq) == 0);
	CHECK(ibv_destroy_comp_channel(a.ch) == 0 && ibv_destroy_comp_channel(b.ch) == 0);
	CHECK(ibv_dereg_mr(a.mr) == 0 && ibv_dereg_mr(b.mr) == 0);
	CHECK(ibv_dealloc_pd(a.pd) == 0 && ibv_dealloc_pd(b.pd) == 0);
	CHECK(ibv_close_device(a.ctx) == 0 && ibv_close_device(b.ctx) == 0);
	ibv_free_device_list(list);
	printf("rc_basic ok\n");
	return 0;
}
