/* A fuzzer of the verbs C ABI: random verb programs with hostile arguments, each run in a
 * forked child so that a crash, a hang or a panic is caught, then minimised (harness.h).
 *
 *   verbs_fuzz SEED CASES        run CASES programs from SEED; exit 1 if any failed
 *   verbs_fuzz SEED CASES -v     the same, printing every call of every program
 *   VERBS_FUZZ_FIRST=N           start at case N (to rerun one found before)
 *   VERBS_FUZZ_SELF_TEST=1       every program that polls a CQ crashes after its calls (the
 *                                test of the fuzzer itself: it must find and minimise that)
 *
 * A program is a list of calls drawn from the verbs an application calls, on up to 8 objects
 * of each kind. Exported verbs get hostile handles (NULL, destroyed, of another type, or
 * pointers to junk) as well as live ones; inline verbs (post, poll, notify, windows), which
 * dereference their object in the application's own code as rdma-core's do, get live
 * handles with hostile contents (absurd counts and sizes, SGEs outside their MR, cyclic WR
 * lists, garbage opcodes, flags and masks). A program fails when its process dies by a
 * signal, does not finish within 10 s, prints a Rust panic, or a verb given a hostile handle
 * succeeds. A failing program is minimised (calls dropped while it still fails the same
 * way) and printed call by call. */
#define _GNU_SOURCE
#define FUZZ_ENV "VERBS_FUZZ"
#include <infiniband/verbs.h>

/* ---- programs ---- */

enum op {
	OP_OPEN, OP_CLOSE, OP_QUERY, OP_ALLOC_PD, OP_DEALLOC_PD, OP_REG_MR, OP_REREG_MR,
	OP_DEREG_MR, OP_CREATE_CH, OP_DESTROY_CH, OP_CREATE_CQ, OP_RESIZE_CQ, OP_DESTROY_CQ,
	OP_NOTIFY_CQ, OP_POLL_CQ, OP_GET_CQ_EVENT, OP_ACK_CQ_EVENTS, OP_CREATE_SRQ, OP_MODIFY_SRQ,
	OP_QUERY_SRQ, OP_DESTROY_SRQ, OP_POST_SRQ_RECV, OP_CREATE_QP, OP_CONNECT, OP_MODIFY_QP,
	OP_QUERY_QP, OP_DESTROY_QP, OP_POST_SEND, OP_POST_RECV, OP_CREATE_AH, OP_DESTROY_AH,
	OP_ALLOC_MW, OP_DEALLOC_MW, OP_BIND_MW, OP_ASYNC_EVENT, OP_CREATE_CQ_EX, OP_CREATE_QP_EX,
	OP_WR_POST, OP_DM, OP_COUNT
};

/* How often each call is drawn: creates and the data path most. */
static const int weight[OP_COUNT] = {
	[OP_OPEN] = 3, [OP_CLOSE] = 1, [OP_QUERY] = 2, [OP_ALLOC_PD] = 4, [OP_DEALLOC_PD] = 1,
	[OP_REG_MR] = 5, [OP_REREG_MR] = 2, [OP_DEREG_MR] = 1, [OP_CREATE_CH] = 2,
	[OP_DESTROY_CH] = 1, [OP_CREATE_CQ] = 5, [OP_RESIZE_CQ] = 1, [OP_DESTROY_CQ] = 1,
	[OP_NOTIFY_CQ] = 2, [OP_POLL_CQ] = 5, [OP_GET_CQ_EVENT] = 1, [OP_ACK_CQ_EVENTS] = 1,
	[OP_CREATE_SRQ] = 2, [OP_MODIFY_SRQ] = 1, [OP_QUERY_SRQ] = 1, [OP_DESTROY_SRQ] = 1,
	[OP_POST_SRQ_RECV] = 2, [OP_CREATE_QP] = 6, [OP_CONNECT] = 5, [OP_MODIFY_QP] = 3,
	[OP_QUERY_QP] = 1, [OP_DESTROY_QP] = 1, [OP_POST_SEND] = 8, [OP_POST_RECV] = 5,
	[OP_CREATE_AH] = 2, [OP_DESTROY_AH] = 1, [OP_ALLOC_MW] = 2, [OP_DEALLOC_MW] = 1,
	[OP_BIND_MW] = 2, [OP_ASYNC_EVENT] = 1, [OP_CREATE_CQ_EX] = 2, [OP_CREATE_QP_EX] = 4,
	[OP_WR_POST] = 5, [OP_DM] = 2,
};

static const char *const op_name[OP_COUNT] = {
	"open_device", "close_device", "query", "alloc_pd", "dealloc_pd", "reg_mr", "rereg_mr",
	"dereg_mr", "create_comp_channel", "destroy_comp_channel", "create_cq", "resize_cq",
	"destroy_cq", "req_notify_cq", "poll_cq", "get_cq_event", "ack_cq_events", "create_srq",
	"modify_srq", "query_srq", "destroy_srq", "post_srq_recv", "create_qp", "connect",
	"modify_qp", "query_qp", "destroy_qp", "post_send", "post_recv", "create_ah",
	"destroy_ah", "alloc_mw", "dealloc_mw", "bind_mw", "get_async_event", "create_cq_ex",
	"create_qp_ex", "wr_post (ibv_wr_*)", "device memory",
};

/* ---- the objects a running program holds ---- */

enum kind { K_CTX, K_PD, K_MR, K_CH, K_CQ, K_SRQ, K_QP, K_AH, K_MW, K_COUNT };

#include "harness.h"

static struct ibv_device **devices;
static int ndevices;

/* Most programs start as an application does (a device, a PD, an MR, a CQ, two RC QPs
 * connected to each other, receives posted), so that the rest reaches connected QPs. */
static void shape(struct program *p, uint64_t seed)
{
	static const enum op prologue[] = { OP_OPEN, OP_ALLOC_PD, OP_REG_MR, OP_CREATE_CQ,
					    OP_CREATE_QP, OP_CREATE_QP, OP_CONNECT, OP_CONNECT,
					    OP_POST_RECV, OP_POST_RECV };
	int np = sizeof prologue / sizeof prologue[0];
	if (seed & 3)
		for (int i = 0; i < np && i < p->n; i++) {
			struct call *c = &p->calls[i];
			c->op = prologue[i];
			c->sane = 1;
			if (c->op == OP_CREATE_QP)
				c->r[4] = 0; /* RC */
			if (c->op == OP_CONNECT || c->op == OP_POST_RECV) {
				c->r[0] = i % 2; /* QP 0 to 1, then 1 to 0 */
				c->r[1] = (i + 1) % 2;
			}
		}
}

static uint32_t some_lkey(uint64_t r, int remote)
{
	struct ibv_mr *mr = live(K_MR, r >> 3);
	switch (r % 4) {
	case 0:
		return (uint32_t)(r >> 32);
	default:
		return mr ? (remote ? mr->rkey : mr->lkey) : 0;
	}
}

/* SGEs into list: addresses mostly inside buf (so an inline copy of a length the verb
 * accepts never reads unmapped memory), lengths from tiny to absurd. */
static void sges(struct ibv_sge *list, int n, uint64_t r)
{
	uint64_t s = r;
	for (int i = 0; i < n; i++) {
		uint64_t a = mix(&s), b = mix(&s);
		struct ibv_mr *mr = live(K_MR, a);
		if (sane && mr && mr->length >= 128) {
			list[i].addr = (uintptr_t)mr->addr + a % 64;
			list[i].length = (uint32_t)PICK(b, 8, 64);
			list[i].lkey = mr->lkey;
			continue;
		}
		list[i].addr = (uintptr_t)(buf + a % (BUF_LEN / 2));
		list[i].length = (uint32_t)PICK(b, 0, 1, 8, 64, 512, 4096, BUF_LEN / 2,
						 0x80000000u, 0xffffffffu);
		list[i].lkey = some_lkey(b >> 8, 0);
		if (b % 13 == 0)
			list[i].addr = (uintptr_t)unmapped_page;
	}
}

/* ---- the calls ---- */

static void port_gid(struct ibv_context *c, union ibv_gid *gid, uint16_t *lid)
{
	struct ibv_port_attr pa;
	memset(gid, 0, sizeof *gid);
	*lid = 0;
	if (ibv_query_port(c, 1, &pa) == 0)
		*lid = pa.lid;
	(void)ibv_query_gid(c, 1, 0, gid);
}

static void fill_ah(struct ibv_ah_attr *ah, struct ibv_context *c, uint64_t r)
{
	uint16_t lid;
	memset(ah, 0, sizeof *ah);
	port_gid(c, &ah->grh.dgid, &lid);
	ah->dlid = r % 5 ? lid : (uint16_t)(r >> 8);
	ah->is_global = r % 7 != 0;
	ah->grh.sgid_index = r % 11 ? 0 : (uint8_t)(r >> 16);
	ah->grh.hop_limit = 64;
	ah->port_num = r % 9 ? 1 : (uint8_t)(r >> 24);
	ah->sl = (uint8_t)((r >> 32) % 20);
}

static int connect_qp(struct ibv_qp *qp, struct ibv_qp *peer, uint64_t r)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				 .qkey = 0x11111111,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
						    IBV_ACCESS_REMOTE_ATOMIC };
	int ud = qp->qp_type == IBV_QPT_UD;
	int ret = ibv_modify_qp(qp, &a,
				IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					(ud ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS));
	if (ret)
		return ret;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	int mask = IBV_QP_STATE;
	if (!ud) {
		a.path_mtu = (enum ibv_mtu)(1 + r % 5);
		a.dest_qp_num = peer->qp_num;
		a.rq_psn = 0;
		a.max_dest_rd_atomic = 1;
		a.min_rnr_timer = 1;
		fill_ah(&a.ah_attr, peer->context, r % 5 ? 1 : r >> 8);
		mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
		if (qp->qp_type == IBV_QPT_RC)
			mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	}
	if ((ret = ibv_modify_qp(qp, &a, mask)))
		return ret;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	a.timeout = 1 + r % 4;
	a.retry_cnt = r % 3;
	a.rnr_retry = r % 3;
	a.max_rd_atomic = 1;
	mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
	if (qp->qp_type == IBV_QPT_RC)
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	return ibv_modify_qp(qp, &a, mask);
}

static const enum ibv_wr_opcode send_ops[] = {
	IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM,
	IBV_WR_RDMA_READ, IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD,
	IBV_WR_LOCAL_INV, IBV_WR_BIND_MW, IBV_WR_SEND_WITH_INV, IBV_WR_TSO, IBV_WR_DRIVER1,
	(enum ibv_wr_opcode)99,
};

static struct ibv_sge sge_pool[3][64];

static void post_send(struct call *c)
{
	struct ibv_qp *qp = live(K_QP, c->r[0]);
	if (!qp)
		return;
	struct ibv_send_wr wr[3], *bad = NULL;
	int n = 1 + c->r[1] % 3;
	uint64_t s = c->r[2];
	memset(wr, 0, sizeof wr);
	for (int i = 0; i < n; i++) {
		uint64_t a = mix(&s), b = mix(&s), d = mix(&s);
		wr[i].wr_id = i;
		wr[i].opcode = send_ops[a % (sane ? 7 : sizeof send_ops / sizeof send_ops[0])];
		wr[i].send_flags = (unsigned)(b % 4 ? (b >> 8) & 0xf : (b >> 8));
		int ns = (int)PICK(b >> 40, 0, 1, 1, 1, 2, 3, 64, 65, 1 << 20, 0x7fffffff, -1);
		if (sane) {
			wr[i].send_flags = IBV_SEND_SIGNALED | (b % 4 ? 0 : IBV_SEND_INLINE);
			ns = 1;
		}
		wr[i].num_sge = ns;
		wr[i].sg_list = sane || (b >> 50) % 16 ? sge_pool[i] : NULL;
		sges(sge_pool[i], 64, d);
		/* Inline data is read by the post itself from wherever the SGEs point (no lkey):
		 * an application's unreadable inline address crashes any provider. */
		if (wr[i].send_flags & IBV_SEND_INLINE)
			for (int j = 0; j < 64; j++)
				if (sge_pool[i][j].addr == (uintptr_t)unmapped_page)
					sge_pool[i][j].addr = (uintptr_t)buf;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
		wr[i].imm_data = (uint32_t)d;
		struct ibv_mr *mr = live(K_MR, d >> 8);
		wr[i].wr.rdma.remote_addr = mr && (sane || d % 3) ? (uintptr_t)mr->addr + (d >> 20) % 64 :
							   (d >> 4);
		wr[i].wr.rdma.rkey = some_lkey(d >> 12, 1);
		if (wr[i].opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
		    wr[i].opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
			wr[i].wr.atomic.remote_addr = wr[i].wr.rdma.remote_addr & ~7ull;
			wr[i].wr.atomic.rkey = wr[i].wr.rdma.rkey;
			wr[i].wr.atomic.compare_add = d;
		}
		if (qp->qp_type == IBV_QPT_UD) {
			int bad_ah;
			const char *what;
			/* A UD WR names its AH: read through the provider's own check. */
			wr[i].wr.ud.ah = handle(K_AH, d >> 24, &bad_ah, &what);
			struct ibv_qp *to = live(K_QP, d);
			wr[i].wr.ud.remote_qpn = to && (d >> 40) % 4 ? to->qp_num : (uint32_t)(d >> 40);
			wr[i].wr.ud.remote_qkey = 0x11111111;
		}
		if (wr[i].opcode == IBV_WR_BIND_MW) {
			wr[i].bind_mw.mw = live(K_MW, d);
			wr[i].bind_mw.rkey = (uint32_t)(d >> 32);
			wr[i].bind_mw.bind_info.mr = live(K_MR, d >> 4);
			wr[i].bind_mw.bind_info.addr = (uintptr_t)buf;
			wr[i].bind_mw.bind_info.length = length(d >> 16);
		}
		if (wr[i].opcode == IBV_WR_LOCAL_INV || wr[i].opcode == IBV_WR_SEND_WITH_INV)
			wr[i].invalidate_rkey = some_lkey(d >> 28, 1);
	}
	if (!sane && c->r[3] % 11 == 0)
		wr[n - 1].next = &wr[0]; /* a cycle */
	LOG("  %d WR(s), opcode %d, flags %#x, num_sge %d%s\n", n, wr[0].opcode,
	    wr[0].send_flags, wr[0].num_sge, wr[n - 1].next ? ", cyclic" : "");
	int ret = ibv_post_send(qp, wr, &bad);
	LOG("  = %d\n", ret);
}

static void post_recv(struct call *c, int srq)
{
	void *q = live(srq ? K_SRQ : K_QP, c->r[0]);
	if (!q)
		return;
	struct ibv_recv_wr wr[2], *bad = NULL;
	int n = 1 + c->r[1] % 2;
	uint64_t s = c->r[2];
	for (int i = 0; i < n; i++) {
		uint64_t b = mix(&s);
		wr[i].wr_id = i;
		wr[i].num_sge = sane ? 1 : (int)PICK(b, 0, 1, 1, 2, 64, 65, 1 << 20, -1);
		wr[i].sg_list = sane || (b >> 50) % 16 ? sge_pool[i] : NULL;
		sges(sge_pool[i], 64, mix(&s));
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
	}
	if (!sane && c->r[3] % 11 == 0)
		wr[n - 1].next = &wr[0];
	LOG("  %d WR(s), num_sge %d%s\n", n, wr[0].num_sge, wr[n - 1].next ? ", cyclic" : "");
	int ret = srq ? ibv_post_srq_recv(q, wr, &bad) : ibv_post_recv(q, wr, &bad);
	LOG("  = %d\n", ret);
}

/* Runs one call. A verb given a hostile handle must fail. */
static void run_call(struct call *c)
{
	uint64_t *r = c->r;
	int bad = 0, bad2 = 0, bad3 = 0;
	const char *what = "", *what2 = "", *what3 = "";
	current = op_name[c->op];
	sane = c->sane;
	LOG("%s%s\n", current, sane ? " (sane)" : "");
#define MUST_FAIL(ok)                                                           \
	do {                                                                    \
		if ((ok) && (bad || bad2 || bad3))                              \
			accepted(bad ? what : bad2 ? what2 : what3);            \
	} while (0)

	switch (c->op) {
	case OP_OPEN: {
		if (!ndevices)
			return;
		struct ibv_context *ctx = ibv_open_device(devices[r[0] % ndevices]);
		int slot = add(K_CTX, ctx, -1);
		if (slot >= 0) {
			pool[K_CTX][slot].ctx = slot;
			/* Event reads must not block the program. */
			fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK);
		}
		break;
	}
	case OP_CLOSE: {
		struct ibv_context *ctx = handle(K_CTX, r[0], &bad, &what);
		int slot = -1;
		for (int i = 0; i < SLOTS; i++)
			if (pool[K_CTX][i].live && pool[K_CTX][i].p == ctx)
				slot = i;
		int ret = ibv_close_device(ctx);
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		if (ret == 0 && slot >= 0)
			for (int k = 0; k < K_COUNT; k++)
				for (int i = 0; i < SLOTS; i++)
					if (pool[k][i].live && pool[k][i].ctx == slot)
						pool[k][i].live = 0;
		break;
	}
	case OP_QUERY: {
		struct ibv_context *ctx = handle(K_CTX, r[0], &bad, &what);
		struct ibv_device_attr da;
		union ibv_gid gid;
		uint16_t pkey;
		int port = (int)PICK(r[1], 0, 1, 1, 2, 255);
		int ret = ibv_query_device(ctx, &da);
		MUST_FAIL(ret == 0);
		ret = ibv_query_gid(ctx, port, (int)PICK(r[2], 0, 1, 15, 16, 255, -1), &gid);
		MUST_FAIL(ret == 0);
		ret = ibv_query_pkey(ctx, port, (int)PICK(r[3], 0, 1, 64, -1), &pkey);
		MUST_FAIL(ret == 0);
		LOG("  %s, port %d\n", what, port);
		struct ibv_context *l = live(K_CTX, r[4]);
		if (l) {
			struct ibv_port_attr pa;
			(void)ibv_query_port(l, port, &pa);
		}
		break;
	}
	case OP_ALLOC_PD: {
		struct ibv_context *ctx = handle(K_CTX, r[0], &bad, &what);
		struct ibv_pd *pd = ibv_alloc_pd(ctx);
		LOG("  %s = %p\n", what, (void *)pd);
		MUST_FAIL(pd != NULL);
		add(K_PD, pd, ctx_of(K_CTX, ctx));
		break;
	}
	case OP_DEALLOC_PD: {
		struct ibv_pd *pd = handle(K_PD, r[0], &bad, &what);
		int ret = ibv_dealloc_pd(pd);
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		if (ret == 0)
			kill_obj(K_PD, pd);
		break;
	}
	case OP_REG_MR: {
		struct ibv_pd *pd = handle(K_PD, r[0], &bad, &what);
		char *addr = address(r[1]);
		size_t len = length(r[2]);
		int access = (int)(r[3] % 4 ? r[3] & 0x1f : r[3] >> 8);
		if (sane || r[3] % 5 == 0)
			access |= IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				  IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
		if (addr == buf + (r[1] >> 8) % (BUF_LEN / 2) && len > BUF_LEN / 2 && r[4] % 2)
			len = BUF_LEN / 2; /* mostly ranges that exist */
		struct ibv_mr *mr = ibv_reg_mr(pd, addr, len, access);
		LOG("  %s, addr %p, length %zu, access %#x = %p\n", what, (void *)addr, len, access,
		    (void *)mr);
		MUST_FAIL(mr != NULL);
		add(K_MR, mr, ctx_of(K_PD, pd));
		break;
	}
	case OP_REREG_MR: {
		struct ibv_mr *mr = handle(K_MR, r[0], &bad, &what);
		struct ibv_pd *pd = handle(K_PD, r[1], &bad2, &what2);
		int flags = (int)(r[2] % 3 ? r[2] & 7 : r[2] >> 8);
		if (!(flags & IBV_REREG_MR_CHANGE_PD))
			bad2 = 0; /* not read */
		char *addr = address(r[3]);
		size_t len = length(r[4]);
		int access = (int)(r[5] & 0x1f);
		int ret = ibv_rereg_mr(mr, flags, pd, addr, len, access);
		LOG("  %s, flags %#x, pd %s, addr %p, length %zu = %d\n", what, flags, what2,
		    (void *)addr, len, ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_DEREG_MR: {
		struct ibv_mr *mr = handle(K_MR, r[0], &bad, &what);
		int ret = ibv_dereg_mr(mr);
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		if (ret == 0)
			kill_obj(K_MR, mr);
		break;
	}
	case OP_CREATE_CH: {
		struct ibv_context *ctx = handle(K_CTX, r[0], &bad, &what);
		struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
		LOG("  %s = %p\n", what, (void *)ch);
		MUST_FAIL(ch != NULL);
		if (ch) {
			fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
			add(K_CH, ch, ctx_of(K_CTX, ctx));
		}
		break;
	}
	case OP_DESTROY_CH: {
		struct ibv_comp_channel *ch = handle(K_CH, r[0], &bad, &what);
		int ret = ibv_destroy_comp_channel(ch);
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		if (ret == 0)
			kill_obj(K_CH, ch);
		break;
	}
	case OP_CREATE_CQ: {
		struct ibv_context *ctx = handle(K_CTX, r[0], &bad, &what);
		struct ibv_comp_channel *ch = NULL;
		if (sane)
			ch = optional(K_CH, r[1]);
		else if (r[1] % 2)
			ch = handle(K_CH, r[1] >> 1, &bad2, &what2);
		if (!ch)
			bad2 = 0; /* a CQ without a channel */
		int cqe = counts(r[2]);
		int vector = sane ? 0 : (int)PICK(r[3], 0, 0, 0, 1, 1000, -1);
		struct ibv_cq *cq = ibv_create_cq(ctx, cqe, NULL, ch, vector);
		LOG("  %s, channel %s, cqe %d, vector %d = %p\n", what, what2, cqe, vector,
		    (void *)cq);
		MUST_FAIL(cq != NULL);
		add(K_CQ, cq, ctx_of(K_CTX, ctx));
		break;
	}
	case OP_RESIZE_CQ: {
		struct ibv_cq *cq = handle(K_CQ, r[0], &bad, &what);
		int cqe = counts(r[1]);
		int ret = ibv_resize_cq(cq, cqe);
		LOG("  %s, cqe %d = %d\n", what, cqe, ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_DESTROY_CQ: {
		struct ibv_cq *cq = handle(K_CQ, r[0], &bad, &what);
		int ret = ibv_destroy_cq(cq);
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		if (ret == 0)
			kill_obj(K_CQ, cq);
		break;
	}
	case OP_NOTIFY_CQ: {
		struct ibv_cq *cq = live(K_CQ, r[0]);
		if (cq)
			LOG("  = %d\n", ibv_req_notify_cq(cq, (int)(r[1] % 3)));
		break;
	}
	case OP_POLL_CQ: {
		struct ibv_cq *cq = live(K_CQ, r[0]);
		struct ibv_wc wc[64];
		if (cq)
			LOG("  = %d\n", ibv_poll_cq(cq, (int)PICK(r[1], 0, 1, 4, 64, -1), wc));
		break;
	}
	case OP_GET_CQ_EVENT: {
		struct ibv_comp_channel *ch = handle(K_CH, r[0], &bad, &what);
		struct ibv_cq *cq;
		void *ctx;
		int ret = ibv_get_cq_event(ch, &cq, &ctx);
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		if (ret == 0)
			ibv_ack_cq_events(cq, 1);
		break;
	}
	case OP_ACK_CQ_EVENTS: {
		/* Acknowledging more than was read is the application's error; what counts here
		 * is that a bad handle does not crash (the verb returns nothing). */
		struct ibv_cq *cq = handle(K_CQ, r[0], &bad, &what);
		LOG("  %s\n", what);
		if (bad)
			ibv_ack_cq_events(cq, (unsigned)(r[1] % 3));
		break;
	}
	case OP_CREATE_SRQ: {
		struct ibv_pd *pd = handle(K_PD, r[0], &bad, &what);
		struct ibv_srq_init_attr a = { .attr = { .max_wr = (uint32_t)counts(r[1]),
							 .max_sge = (uint32_t)counts(r[2]),
							 .srq_limit = (uint32_t)counts(r[3]) } };
		struct ibv_srq *srq = ibv_create_srq(pd, &a);
		LOG("  %s, max_wr %u, max_sge %u = %p\n", what, a.attr.max_wr, a.attr.max_sge,
		    (void *)srq);
		MUST_FAIL(srq != NULL);
		add(K_SRQ, srq, ctx_of(K_PD, pd));
		break;
	}
	case OP_MODIFY_SRQ: {
		struct ibv_srq *srq = handle(K_SRQ, r[0], &bad, &what);
		struct ibv_srq_attr a = { .max_wr = (uint32_t)counts(r[1]),
					  .srq_limit = (uint32_t)counts(r[2]) };
		int mask = (int)(r[3] % 4 ? r[3] & 3 : r[3] >> 8);
		int ret = ibv_modify_srq(srq, &a, mask);
		LOG("  %s, mask %#x = %d\n", what, mask, ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_QUERY_SRQ: {
		struct ibv_srq *srq = handle(K_SRQ, r[0], &bad, &what);
		struct ibv_srq_attr a;
		int ret = ibv_query_srq(srq, &a);
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_DESTROY_SRQ: {
		struct ibv_srq *srq = handle(K_SRQ, r[0], &bad, &what);
		int ret = ibv_destroy_srq(srq);
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		if (ret == 0)
			kill_obj(K_SRQ, srq);
		break;
	}
	case OP_POST_SRQ_RECV:
		post_recv(c, 1);
		break;
	case OP_CREATE_QP: {
		struct ibv_pd *pd = handle(K_PD, r[0], &bad, &what);
		struct ibv_qp_init_attr a = { 0 };
		a.send_cq = handle(K_CQ, r[1], &bad2, &what2);
		a.recv_cq = r[2] % 4 ? a.send_cq : live(K_CQ, r[2] >> 2);
		a.srq = r[3] % 4 ? NULL : optional(K_SRQ, r[3] >> 2);
		a.qp_type = (enum ibv_qp_type)PICK(r[4] % (sane ? 4 : 9), IBV_QPT_RC, IBV_QPT_RC,
						     IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_RC, IBV_QPT_UD,
						     IBV_QPT_XRC_SEND, IBV_QPT_RAW_PACKET, 77);
		int small = sane || r[5] % 3 != 0;
		a.cap.max_send_wr = small ? 1 + r[5] % 16 : (uint32_t)counts(r[5] >> 8);
		a.cap.max_recv_wr = small ? 1 + (r[5] >> 8) % 16 : (uint32_t)counts(r[5] >> 16);
		a.cap.max_send_sge = small ? 1 + (r[6] % 3) : (uint32_t)counts(r[6] >> 8);
		a.cap.max_recv_sge = small ? 1 + ((r[6] >> 4) % 3) : (uint32_t)counts(r[6] >> 16);
		a.cap.max_inline_data =
			(uint32_t)PICK(r[7] % (sane ? 4 : 6), 0, 64, 64, 256, 1 << 20, 0xffffffff);
		a.sq_sig_all = (int)(r[7] >> 8) % 2;
		struct ibv_qp *qp = ibv_create_qp(pd, &a);
		LOG("  pd %s, cq %s, type %d, caps %u/%u/%u/%u/%u = %p\n", what, what2, a.qp_type,
		    a.cap.max_send_wr, a.cap.max_recv_wr, a.cap.max_send_sge, a.cap.max_recv_sge,
		    a.cap.max_inline_data, (void *)qp);
		MUST_FAIL(qp != NULL);
		add(K_QP, qp, ctx_of(K_PD, pd));
		break;
	}
	case OP_CONNECT: {
		struct ibv_qp *qp = live(K_QP, r[0]), *peer = live(K_QP, r[1]);
		if (qp && peer)
			LOG("  = %d\n", connect_qp(qp, peer, r[2]));
		break;
	}
	case OP_MODIFY_QP: {
		struct ibv_qp *qp = handle(K_QP, r[0], &bad, &what);
		struct ibv_qp_attr a;
		uint64_t s = r[1];
		/* Random bytes with plausible states. */
		for (size_t i = 0; i < sizeof a; i += 8) {
			uint64_t w = mix(&s);
			memcpy((char *)&a + i, &w, sizeof a - i < 8 ? sizeof a - i : 8);
		}
		a.qp_state = (enum ibv_qp_state)(r[2] % 9);
		a.cur_qp_state = (enum ibv_qp_state)((r[2] >> 8) % 9);
		if (r[3] % 2) {
			a.port_num = 1;
			a.pkey_index = 0;
			a.ah_attr.port_num = 1;
		}
		int mask = (int)(r[4] % 3 ? (r[4] >> 8) & 0x1fffff : r[4] >> 8) | IBV_QP_STATE;
		if (r[4] % 5 == 0)
			mask &= ~IBV_QP_STATE;
		int ret = ibv_modify_qp(qp, &a, mask);
		LOG("  %s, state %d, mask %#x = %d\n", what, a.qp_state, mask, ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_QUERY_QP: {
		struct ibv_qp *qp = handle(K_QP, r[0], &bad, &what);
		struct ibv_qp_attr a;
		struct ibv_qp_init_attr ia;
		int ret = ibv_query_qp(qp, &a, (int)r[1], &ia);
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_DESTROY_QP: {
		struct ibv_qp *qp = handle(K_QP, r[0], &bad, &what);
		int ret = ibv_destroy_qp(qp);
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		if (ret == 0)
			kill_obj(K_QP, qp);
		break;
	}
	case OP_POST_SEND:
		post_send(c);
		break;
	case OP_POST_RECV:
		post_recv(c, 0);
		break;
	case OP_CREATE_AH: {
		struct ibv_pd *pd = handle(K_PD, r[0], &bad, &what);
		struct ibv_context *c2 = live(K_CTX, r[1]);
		struct ibv_ah_attr a;
		if (!c2)
			return;
		fill_ah(&a, c2, r[2]);
		struct ibv_ah *ah = ibv_create_ah(pd, &a);
		LOG("  %s, port %d, global %d = %p\n", what, a.port_num, a.is_global, (void *)ah);
		MUST_FAIL(ah != NULL);
		add(K_AH, ah, ctx_of(K_PD, pd));
		break;
	}
	case OP_DESTROY_AH: {
		struct ibv_ah *ah = handle(K_AH, r[0], &bad, &what);
		int ret = ibv_destroy_ah(ah);
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		if (ret == 0)
			kill_obj(K_AH, ah);
		break;
	}
	case OP_ALLOC_MW: {
		struct ibv_pd *pd = live(K_PD, r[0]);
		if (!pd)
			return;
		enum ibv_mw_type t = (enum ibv_mw_type)PICK(r[1], IBV_MW_TYPE_1, IBV_MW_TYPE_2, 0, 3);
		struct ibv_mw *mw = ibv_alloc_mw(pd, t);
		LOG("  type %d = %p\n", t, (void *)mw);
		add(K_MW, mw, ctx_of(K_PD, pd));
		break;
	}
	case OP_DEALLOC_MW: {
		struct ibv_mw *mw = live(K_MW, r[0]);
		if (!mw)
			return;
		int ret = ibv_dealloc_mw(mw);
		LOG("  = %d\n", ret);
		if (ret == 0)
			kill_obj(K_MW, mw);
		break;
	}
	case OP_BIND_MW: {
		struct ibv_qp *qp = live(K_QP, r[0]);
		struct ibv_mw *mw = live(K_MW, r[1]);
		if (!qp || !mw)
			return;
		struct ibv_mw_bind b = { .wr_id = 1, .send_flags = (unsigned)(r[2] & 0xf) };
		b.bind_info.mr = handle(K_MR, r[3], &bad, &what);
		b.bind_info.addr = (uintptr_t)address(r[4]);
		b.bind_info.length = length(r[5]);
		b.bind_info.mw_access_flags = (unsigned)(r[6] & 0x1f);
		int ret = ibv_bind_mw(qp, mw, &b);
		LOG("  mr %s, length %" PRIu64 " = %d\n", what, (uint64_t)b.bind_info.length, ret);
		MUST_FAIL(ret == 0 && b.bind_info.mr != NULL);
		break;
	}
	case OP_ASYNC_EVENT: {
		struct ibv_context *ctx = handle(K_CTX, r[0], &bad, &what);
		struct ibv_async_event ev;
		int ret = ibv_get_async_event(ctx, &ev);
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		if (ret == 0)
			ibv_ack_async_event(&ev);
		break;
	}
	case OP_CREATE_CQ_EX: {
		struct ibv_context *ctx = live(K_CTX, r[0]);
		if (!ctx)
			return;
		struct ibv_cq_init_attr_ex a = { .cqe = (uint32_t)counts(r[1]) };
		a.wc_flags = r[2] % 3 ? (r[2] >> 8) & 0x7f : r[2] >> 8;
		a.comp_mask = (uint32_t)(r[3] % 3 ? 0 : r[3] >> 8);
		a.flags = (uint32_t)(r[3] % 5 ? 0 : r[3] >> 40);
		a.channel = r[4] % 2 ? NULL : handle(K_CH, r[4] >> 1, &bad, &what);
		a.parent_domain = handle(K_PD, r[5], &bad2, &what2);
		if (!(a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD))
			bad2 = 0;
		if (!a.channel)
			bad = 0;
		struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &a);
		LOG("  cqe %u, wc_flags %#" PRIx64 ", comp_mask %#x, channel %s = %p\n", a.cqe,
		    (uint64_t)a.wc_flags, a.comp_mask, what, (void *)cq);
		/* A parent domain that is a plain PD is refused too: only the channel counts. */
		bad2 = 0;
		MUST_FAIL(cq != NULL);
		add(K_CQ, cq ? ibv_cq_ex_to_cq(cq) : NULL, ctx_of(K_CTX, ctx));
		break;
	}
	case OP_CREATE_QP_EX: {
		struct ibv_context *ctx = live(K_CTX, r[0]);
		if (!ctx)
			return;
		struct ibv_qp_init_attr_ex a;
		memset(&a, 0, sizeof a);
		a.qp_type = (enum ibv_qp_type)PICK(r[1] % (sane ? 4 : 7), IBV_QPT_RC, IBV_QPT_UC,
						   IBV_QPT_UD, IBV_QPT_RC, IBV_QPT_XRC_SEND,
						   IBV_QPT_DRIVER, 0);
		a.send_cq = handle(K_CQ, r[2], &bad, &what);
		a.recv_cq = a.send_cq;
		a.cap = (struct ibv_qp_cap){ 8, 8, 2, 2, 64 };
		if (!sane && r[2] % 4 == 0)
			a.cap.max_send_sge = (uint32_t)counts(r[2] >> 8);
		a.pd = handle(K_PD, r[3], &bad2, &what2);
		a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		if (!sane && r[4] % 3 == 0)
			a.comp_mask = (uint32_t)(r[4] >> 8) & 0x7f;
		a.send_ops_flags = sane || r[5] % 3 ? (r[5] >> 8) & 0xff : r[5] >> 8;
		if (a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS)
			a.create_flags = (uint32_t)(r[6] >> 8);
		if (a.comp_mask & IBV_QP_INIT_ATTR_XRCD)
			a.xrcd = (struct ibv_xrcd *)(junk + 64);
		if (a.comp_mask & IBV_QP_INIT_ATTR_IND_TABLE)
			a.rwq_ind_tbl = (struct ibv_rwq_ind_table *)(junk + 128);
		if (a.comp_mask & IBV_QP_INIT_ATTR_RX_HASH) {
			static uint8_t key[40];
			a.rx_hash_conf.rx_hash_key_len = (uint8_t)(r[6] % 2 ? 40 : 0);
			a.rx_hash_conf.rx_hash_key = key;
			a.rx_hash_conf.rx_hash_fields_mask = r[6] >> 16;
		}
		if (!(a.comp_mask & IBV_QP_INIT_ATTR_PD))
			bad2 = 0; /* not read */
		struct ibv_qp *qp = ibv_create_qp_ex(ctx, &a);
		LOG("  type %d, cq %s, pd %s, comp_mask %#x, send_ops %#" PRIx64 " = %p\n", a.qp_type,
		    what, what2, a.comp_mask, (uint64_t)a.send_ops_flags, (void *)qp);
		MUST_FAIL(qp != NULL);
		int slot = add(K_QP, qp, ctx_of(K_PD, a.pd));
		if (slot >= 0 && (a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS))
			pool[K_QP][slot].ex = 1;
		break;
	}
	case OP_WR_POST: {
		int slot = -1;
		for (int i = 0, n = 0; i < SLOTS; i++)
			if (pool[K_QP][i].live && pool[K_QP][i].ex && (r[0] % ++n == 0))
				slot = i;
		if (slot < 0)
			return;
		struct ibv_qp *qp = pool[K_QP][slot].p;
		struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(qp);
		if (!qx)
			return;
		int n = 1 + (int)(r[1] % 3);
		uint64_t s = r[2];
		ibv_wr_start(qx);
		for (int i = 0; i < n; i++) {
			uint64_t a = mix(&s), b = mix(&s);
			struct ibv_mr *mr = live(K_MR, b);
			uint32_t rkey = some_lkey(b >> 8, 1);
			uint64_t raddr = mr ? (uintptr_t)mr->addr : b;
			qx->wr_id = i;
			qx->wr_flags = (unsigned)(sane ? IBV_SEND_SIGNALED : (a >> 8) & 0xf);
			switch (a % 7) {
			case 0: ibv_wr_send(qx); break;
			case 1: ibv_wr_send_imm(qx, (uint32_t)b); break;
			case 2: ibv_wr_rdma_write(qx, rkey, raddr); break;
			case 3: ibv_wr_rdma_write_imm(qx, rkey, raddr, 7); break;
			case 4: ibv_wr_rdma_read(qx, rkey, raddr); break;
			case 5: ibv_wr_atomic_fetch_add(qx, rkey, raddr & ~7ull, 1); break;
			default: ibv_wr_atomic_cmp_swp(qx, rkey, raddr & ~7ull, 0, 1); break;
			}
			if (qp->qp_type == IBV_QPT_UD) {
				struct ibv_ah *ah = live(K_AH, b >> 4);
				struct ibv_qp *to = live(K_QP, b >> 12);
				if (ah)
					ibv_wr_set_ud_addr(qx, ah, to ? to->qp_num : 0, 0x11111111);
			}
			sges(sge_pool[0], 64, mix(&s));
			switch ((b >> 20) % (sane ? 1 : 3)) {
			case 0:
				ibv_wr_set_sge(qx, sge_pool[0][0].lkey, sge_pool[0][0].addr,
					       sge_pool[0][0].length);
				break;
			case 1:
				ibv_wr_set_sge_list(qx, (size_t)PICK(b >> 24, 0, 2, 64, 1 << 20),
						    sge_pool[0]);
				break;
			default:
				/* Readable bytes up to 32 KiB; absurd lengths beyond must be refused
				 * before anything is read. */
				ibv_wr_set_inline_data(qx, buf, length(b >> 28) % (1ull << 40));
				break;
			}
		}
		int ret = r[3] % 8 ? ibv_wr_complete(qx) : (ibv_wr_abort(qx), 0);
		LOG("  %d WR(s) = %d\n", n, ret);
		break;
	}
	case OP_DM: {
		struct ibv_context *ctx = live(K_CTX, r[0]);
		if (!ctx)
			return;
		struct ibv_alloc_dm_attr a = { .length = length(r[1]), .log_align_req = (uint32_t)r[2] % 40,
					       .comp_mask = (uint32_t)(r[2] % 3 ? 0 : r[2] >> 8) };
		struct ibv_dm *dm = ibv_alloc_dm(ctx, &a);
		LOG("  length %zu, align %u, comp_mask %#x = %p\n", a.length, a.log_align_req,
		    a.comp_mask, (void *)dm);
		if (!dm)
			return;
		uint64_t off = PICK(r[3], 0, 8, 4096, 1ull << 40, (uint64_t)-8);
		size_t len = length(r[4]);
		/* The host side is readable for 32 KiB; a longer copy must be refused first. */
		LOG("  memcpy_to_dm %" PRIu64 " %zu = %d\n", off, len,
		    ibv_memcpy_to_dm(dm, off, buf, len));
		LOG("  memcpy_from_dm = %d\n", ibv_memcpy_from_dm(buf + BUF_LEN / 2, dm, off,
								   len < BUF_LEN / 2 ? len : 8));
		struct ibv_pd *pd = live(K_PD, r[5]);
		if (pd) {
			struct ibv_mr *mr = ibv_reg_dm_mr(pd, dm, off, len,
							  (unsigned)(r[6] & 0x1f) |
								  IBV_ACCESS_ZERO_BASED);
			LOG("  reg_dm_mr = %p\n", (void *)mr);
			if (mr && r[6] % 2)
				(void)ibv_dereg_mr(mr);
		}
		if (r[7] % 2)
			LOG("  free_dm = %d\n", ibv_free_dm(dm));
		break;
	}
	case OP_COUNT:
		break;
	}
#undef MUST_FAIL
}

static void setup(void)
{
	devices = ibv_get_device_list(&ndevices);
}

/* Closes what is left open, live objects and all. */
static void teardown(void)
{
	current = "close_device at the end";
	for (int i = 0; i < SLOTS; i++)
		if (pool[K_CTX][i].live && ibv_close_device(pool[K_CTX][i].p))
			_exit(4);
	ibv_free_device_list(devices);
}

static int self_test_crashes(const struct call *c)
{
	return c->op == OP_POLL_CQ;
}
