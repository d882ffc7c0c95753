/*
 * The conformance trace runner: reads verb programs (one call per line, on symbolic handles)
 * from stdin, runs each through the real libibverbs C ABI on the first RDMA device, and prints
 * a normalized trace on stdout. Built against the system's <infiniband/verbs.h>, so the inline
 * verbs (ibv_post_send, ibv_poll_cq, ibv_req_notify_cq, ...) are the real inline code.
 *
 * The same binary runs on the kernel's rxe (in the VM) and on the emulator (through the shim's
 * libibverbs.so.1). Normalization happens here: QPNs are printed as the names of the QPs they
 * belong to; keys, addresses, GIDs and timestamps are never printed.
 *
 * The language is documented in docs/conformance.md and generated from the catalogue in
 * conformance/src/catalogue.rs; the two must agree (a test checks every catalogue verb here).
 *
 * Environment: RUNNER_TIMEOUT_MS (how long `poll` waits for its count, default 2000),
 * RUNNER_SETTLE_MS (how long `drain`, `events` and `cq_event` wait for more, default 20),
 * RXE_GID_INDEX (the GID of address handles and RC/UC paths, default 1).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <poll.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_OBJS 64
#define MAX_TOKS 32
#define MAX_WC 256
#define MAX_CHAIN 64

enum kind { K_NONE, K_PD, K_MR, K_CQ, K_CHAN, K_QP, K_SRQ, K_AH, K_MW };

struct obj {
	char name[32];
	enum kind kind;
	void *p;
	/* MR: its buffer and length. MW: the bound window's start and the rkey last bound. */
	char *buf;
	size_t len;
	uint64_t mw_addr;
	uint32_t mw_rkey;
	int qp_type; /* QP */
	int sig_all; /* QP */
	/* QP: made by ibv_create_qp_ex with its type's send operations, posted to through the
	 * ibv_wr_* calls. CQ: made by ibv_create_cq_ex, polled through ibv_start_poll. */
	int ex;
};

static struct ibv_device *dev;
static struct ibv_context *ctx;
static struct obj objs[MAX_OBJS];
/* A verb that printed its own result returns this. */
#define PRINTED (-1000)

static int timeout_ms = 2000, settle_ms = 20, gid_index = 1;
static char line_out[8192];
static char program_name[64];

/* Work requests posted and not yet completed, so that `poll` knows what to wait for. */
struct pending {
	int obj; /* the QP's slot */
	int recv;
	int signaled;
	uint64_t wr_id;
};
static struct pending pending[1024];
static int n_pending;

static void add_pending(struct obj *qp, int recv, int signaled, uint64_t wr_id)
{
	if (n_pending < (int)(sizeof(pending) / sizeof(pending[0])))
		pending[n_pending++] = (struct pending){ qp - objs, recv, signaled, wr_id };
}

/* Forgets the first pending WR of `qp` with `wr_id`; receives are looked for first only when
 * `recv_first` (the completion says it is a receive). */
static int complete_pending(const char *qp, uint64_t wr_id, int recv_first)
{
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < n_pending; i++)
			if (pending[i].wr_id == wr_id && !strcmp(objs[pending[i].obj].name, qp) &&
			    pending[i].recv == (pass == 0 ? recv_first : !recv_first)) {
				int recv = pending[i].recv;
				pending[i] = pending[--n_pending];
				return recv;
			}
	return recv_first;
}

static void forget_pending(struct obj *qp)
{
	for (int i = 0; i < n_pending; i++)
		if (pending[i].obj == qp - objs)
			pending[i--] = pending[--n_pending];
}

static void out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void out(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
}

static const char *err_name(int e)
{
	const char *n = e ? strerrorname_np(e) : "ok";
	return n ? n : "E?";
}

static long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- the object table ---- */

static struct obj *find(const char *name, enum kind kind)
{
	for (int i = 0; i < MAX_OBJS; i++)
		if (objs[i].kind != K_NONE && !strcmp(objs[i].name, name) &&
		    (kind == K_NONE || objs[i].kind == kind))
			return &objs[i];
	return NULL;
}

/* A free slot named `name` (its kind is set once the verb succeeds); NULL if the name is live. */
static struct obj *make(const char *name)
{
	if (find(name, K_NONE))
		return NULL;
	for (int i = 0; i < MAX_OBJS; i++)
		if (objs[i].kind == K_NONE) {
			memset(&objs[i], 0, sizeof(objs[i]));
			snprintf(objs[i].name, sizeof(objs[i].name), "%s", name);
			return &objs[i];
		}
	return NULL;
}

static const char *qp_name(uint32_t qpn)
{
	for (int i = 0; i < MAX_OBJS; i++)
		if (objs[i].kind == K_QP && ((struct ibv_qp *)objs[i].p)->qp_num == qpn)
			return objs[i].name;
	return "qp?";
}

static const char *name_of(void *p)
{
	for (int i = 0; i < MAX_OBJS; i++)
		if (objs[i].kind != K_NONE && objs[i].p == p)
			return objs[i].name;
	return "?";
}

/* ---- arguments: positional tokens and key=value options ---- */

struct args {
	int n;
	char *tok[MAX_TOKS];
	int used[MAX_TOKS];
};

/* A malformed program is the program's fault, not the device's: the call prints `=> BADARG`. */
static int bad_arg;

static const char *opt(struct args *a, const char *key)
{
	size_t k = strlen(key);
	for (int i = 1; i < a->n; i++)
		if (!strncmp(a->tok[i], key, k) && a->tok[i][k] == '=') {
			a->used[i] = 1;
			return a->tok[i] + k + 1;
		}
	return NULL;
}

static int flag(struct args *a, const char *word)
{
	for (int i = 1; i < a->n; i++)
		if (!strcmp(a->tok[i], word)) {
			a->used[i] = 1;
			return 1;
		}
	return 0;
}

static const char *pos(struct args *a, int idx)
{
	int seen = 0;
	for (int i = 1; i < a->n; i++) {
		if (strchr(a->tok[i], '='))
			continue;
		if (seen++ == idx) {
			a->used[i] = 1;
			return a->tok[i];
		}
	}
	bad_arg = 1;
	return "";
}

static uint64_t num(const char *s)
{
	char *end;
	uint64_t v = strtoull(s, &end, 0);
	if (!*s || *end)
		bad_arg = 1;
	return v;
}

static uint64_t opt_num(struct args *a, const char *key, uint64_t dflt)
{
	const char *v = opt(a, key);
	return v ? num(v) : dflt;
}

static struct obj *obj_arg(const char *name, enum kind kind)
{
	struct obj *o = find(name, kind);
	if (!o)
		bad_arg = 1;
	return o;
}

struct named {
	const char *name;
	unsigned value;
};

static unsigned parse_flags(const char *s, const struct named *table)
{
	unsigned v = 0;
	char buf[256];
	snprintf(buf, sizeof(buf), "%s", s);
	if (!strcmp(buf, "0"))
		return 0;
	for (char *save, *t = strtok_r(buf, "|", &save); t; t = strtok_r(NULL, "|", &save)) {
		const struct named *n = table;
		while (n->name && strcmp(n->name, t))
			n++;
		if (!n->name)
			bad_arg = 1;
		v |= n->value;
	}
	return v;
}

static const char *lookup(const struct named *table, unsigned value)
{
	for (const struct named *n = table; n->name; n++)
		if (n->value == value)
			return n->name;
	return "?";
}

static const struct named access_names[] = {
	{ "LW", IBV_ACCESS_LOCAL_WRITE },   { "RW", IBV_ACCESS_REMOTE_WRITE },
	{ "RR", IBV_ACCESS_REMOTE_READ },   { "RA", IBV_ACCESS_REMOTE_ATOMIC },
	{ "MW", IBV_ACCESS_MW_BIND },	    { "ZB", IBV_ACCESS_ZERO_BASED },
	/* On-demand paging; the FLUSH rights (rdma-core 45's IBV_ACCESS_FLUSH_GLOBAL/PERSISTENT). */
	{ "OD", IBV_ACCESS_ON_DEMAND },	    { "FG", 1 << 8 },
	{ "FP", 1 << 9 },
	{ NULL, 0 },
};

static const struct named send_flag_names[] = {
	{ "sig", IBV_SEND_SIGNALED }, { "sol", IBV_SEND_SOLICITED },
	{ "inl", IBV_SEND_INLINE },   { "fence", IBV_SEND_FENCE },
	{ NULL, 0 },
};

static const struct named opcode_names[] = {
	{ "SEND", IBV_WR_SEND },
	{ "SEND_IMM", IBV_WR_SEND_WITH_IMM },
	{ "WRITE", IBV_WR_RDMA_WRITE },
	{ "WRITE_IMM", IBV_WR_RDMA_WRITE_WITH_IMM },
	{ "READ", IBV_WR_RDMA_READ },
	{ "CAS", IBV_WR_ATOMIC_CMP_AND_SWP },
	{ "FAA", IBV_WR_ATOMIC_FETCH_AND_ADD },
	{ "LOCAL_INV", IBV_WR_LOCAL_INV },
	{ "BIND_MW", IBV_WR_BIND_MW },
	{ "SEND_INV", IBV_WR_SEND_WITH_INV },
	{ "ATOMIC_WRITE", IBV_WR_ATOMIC_WRITE },
	{ NULL, 0 },
};

static const struct named qp_state_names[] = {
	{ "RESET", IBV_QPS_RESET }, { "INIT", IBV_QPS_INIT }, { "RTR", IBV_QPS_RTR },
	{ "RTS", IBV_QPS_RTS },	    { "SQD", IBV_QPS_SQD },   { "SQE", IBV_QPS_SQE },
	{ "ERR", IBV_QPS_ERR },	    { NULL, 0 },
};

static const struct named qp_type_names[] = {
	{ "RC", IBV_QPT_RC }, { "UC", IBV_QPT_UC }, { "UD", IBV_QPT_UD }, { NULL, 0 },
};

static const struct named wc_opcode_names[] = {
	{ "SEND", IBV_WC_SEND },
	{ "WRITE", IBV_WC_RDMA_WRITE },
	{ "READ", IBV_WC_RDMA_READ },
	{ "CAS", IBV_WC_COMP_SWAP },
	{ "FAA", IBV_WC_FETCH_ADD },
	{ "BIND_MW", IBV_WC_BIND_MW },
	{ "LOCAL_INV", IBV_WC_LOCAL_INV },
	{ "RECV", IBV_WC_RECV },
	{ "RECV_IMM", IBV_WC_RECV_RDMA_WITH_IMM },
	{ "ATOMIC_WRITE", IBV_WC_ATOMIC_WRITE },
	{ NULL, 0 },
};

static const struct named wc_status_names[] = {
	{ "SUCCESS", IBV_WC_SUCCESS },
	{ "LOC_LEN_ERR", IBV_WC_LOC_LEN_ERR },
	{ "LOC_QP_OP_ERR", IBV_WC_LOC_QP_OP_ERR },
	{ "LOC_EEC_OP_ERR", IBV_WC_LOC_EEC_OP_ERR },
	{ "LOC_PROT_ERR", IBV_WC_LOC_PROT_ERR },
	{ "WR_FLUSH_ERR", IBV_WC_WR_FLUSH_ERR },
	{ "MW_BIND_ERR", IBV_WC_MW_BIND_ERR },
	{ "BAD_RESP_ERR", IBV_WC_BAD_RESP_ERR },
	{ "LOC_ACCESS_ERR", IBV_WC_LOC_ACCESS_ERR },
	{ "REM_INV_REQ_ERR", IBV_WC_REM_INV_REQ_ERR },
	{ "REM_ACCESS_ERR", IBV_WC_REM_ACCESS_ERR },
	{ "REM_OP_ERR", IBV_WC_REM_OP_ERR },
	{ "RETRY_EXC_ERR", IBV_WC_RETRY_EXC_ERR },
	{ "RNR_RETRY_EXC_ERR", IBV_WC_RNR_RETRY_EXC_ERR },
	{ "LOC_RDD_VIOL_ERR", IBV_WC_LOC_RDD_VIOL_ERR },
	{ "REM_INV_RD_REQ_ERR", IBV_WC_REM_INV_RD_REQ_ERR },
	{ "REM_ABORT_ERR", IBV_WC_REM_ABORT_ERR },
	{ "INV_EECN_ERR", IBV_WC_INV_EECN_ERR },
	{ "INV_EEC_STATE_ERR", IBV_WC_INV_EEC_STATE_ERR },
	{ "FATAL_ERR", IBV_WC_FATAL_ERR },
	{ "RESP_TIMEOUT_ERR", IBV_WC_RESP_TIMEOUT_ERR },
	{ "GENERAL_ERR", IBV_WC_GENERAL_ERR },
	{ "TM_ERR", IBV_WC_TM_ERR },
	{ "TM_RNDV_INCOMPLETE", IBV_WC_TM_RNDV_INCOMPLETE },
	{ NULL, 0 },
};

static const struct named event_names[] = {
	{ "CQ_ERR", IBV_EVENT_CQ_ERR },
	{ "QP_FATAL", IBV_EVENT_QP_FATAL },
	{ "QP_REQ_ERR", IBV_EVENT_QP_REQ_ERR },
	{ "QP_ACCESS_ERR", IBV_EVENT_QP_ACCESS_ERR },
	{ "COMM_EST", IBV_EVENT_COMM_EST },
	{ "SQ_DRAINED", IBV_EVENT_SQ_DRAINED },
	{ "PATH_MIG", IBV_EVENT_PATH_MIG },
	{ "PATH_MIG_ERR", IBV_EVENT_PATH_MIG_ERR },
	{ "DEVICE_FATAL", IBV_EVENT_DEVICE_FATAL },
	{ "PORT_ACTIVE", IBV_EVENT_PORT_ACTIVE },
	{ "PORT_ERR", IBV_EVENT_PORT_ERR },
	{ "LID_CHANGE", IBV_EVENT_LID_CHANGE },
	{ "PKEY_CHANGE", IBV_EVENT_PKEY_CHANGE },
	{ "SM_CHANGE", IBV_EVENT_SM_CHANGE },
	{ "SRQ_ERR", IBV_EVENT_SRQ_ERR },
	{ "SRQ_LIMIT_REACHED", IBV_EVENT_SRQ_LIMIT_REACHED },
	{ "QP_LAST_WQE_REACHED", IBV_EVENT_QP_LAST_WQE_REACHED },
	{ "CLIENT_REREGISTER", IBV_EVENT_CLIENT_REREGISTER },
	{ "GID_CHANGE", IBV_EVENT_GID_CHANGE },
	{ "WQ_FATAL", IBV_EVENT_WQ_FATAL },
	{ NULL, 0 },
};

static const struct named mtu_names[] = {
	{ "256", IBV_MTU_256 },	  { "512", IBV_MTU_512 },   { "1024", IBV_MTU_1024 },
	{ "2048", IBV_MTU_2048 }, { "4096", IBV_MTU_4096 }, { NULL, 0 },
};

static unsigned named_value(const struct named *table, const char *s)
{
	for (const struct named *n = table; n->name; n++)
		if (!strcmp(n->name, s))
			return n->value;
	bad_arg = 1;
	return 0;
}

/* ---- printing completions and events ---- */

struct wc_line {
	const char *qp;
	int recv; /* from the receive queue (an SRQ's or the QP's own) */
	char text[200];
};

static void format_wc(const struct ibv_wc *wc, struct wc_line *l)
{
	int n;
	l->qp = qp_name(wc->qp_num);
	l->recv = complete_pending(l->qp, wc->wr_id,
				   wc->status == IBV_WC_SUCCESS && (wc->opcode & IBV_WC_RECV));
	n = snprintf(l->text, sizeof(l->text), "wc %s wr=%llu %s", l->qp,
		     (unsigned long long)wc->wr_id, lookup(wc_status_names, wc->status));
	/* Only a successful completion's other fields are defined (ibv_poll_cq(3)). */
	if (wc->status != IBV_WC_SUCCESS)
		return;
	n += snprintf(l->text + n, sizeof(l->text) - n, " op=%s",
		      lookup(wc_opcode_names, wc->opcode));
	if (wc->opcode & IBV_WC_RECV)
		n += snprintf(l->text + n, sizeof(l->text) - n, " len=%u", wc->byte_len);
	if (wc->wc_flags & IBV_WC_WITH_IMM)
		n += snprintf(l->text + n, sizeof(l->text) - n, " imm=%u", ntohl(wc->imm_data));
	if (wc->wc_flags & IBV_WC_WITH_INV)
		n += snprintf(l->text + n, sizeof(l->text) - n, " inv");
	if (wc->wc_flags & IBV_WC_IP_CSUM_OK)
		n += snprintf(l->text + n, sizeof(l->text) - n, " csum");
	if (wc->wc_flags & IBV_WC_GRH)
		n += snprintf(l->text + n, sizeof(l->text) - n, " grh");
	if (wc->opcode & IBV_WC_RECV) {
		struct ibv_qp *qp = NULL;
		struct obj *o = find(l->qp, K_QP);
		if (o)
			qp = o->p;
		if (qp && qp->qp_type == IBV_QPT_UD)
			snprintf(l->text + n, sizeof(l->text) - n, " src=%s", qp_name(wc->src_qp));
	}
}

/* Completions of different QPs sharing a CQ, and of one QP's send and receive queues, may
 * interleave differently from device to device; each queue's own order is kept (a stable sort
 * by QP name, then send before receive). */
static int wc_after(const struct wc_line *a, const struct wc_line *b)
{
	int c = strcmp(a->qp, b->qp);
	return c > 0 || (c == 0 && a->recv > b->recv);
}

static void print_wcs(struct wc_line *lines, int n)
{
	for (int i = 1; i < n; i++) {
		struct wc_line t = lines[i];
		int j = i - 1;
		while (j >= 0 && wc_after(&lines[j], &t)) {
			lines[j + 1] = lines[j];
			j--;
		}
		lines[j + 1] = t;
	}
	for (int i = 0; i < n; i++)
		out("  %s\n", lines[i].text);
}

/* One completion of an extended CQ, read field by field into `wc` (those of an unsuccessful one
 * that ibv_create_cq_ex(3) leaves undefined are left 0): whether there was one, or -errno. One
 * a batch, from ibv_start_poll to ibv_end_poll: rdma-core 44's rxe advances its CQ past a
 * completion once more when ibv_end_poll follows an ibv_next_poll that found none. */
static int poll_ex(struct ibv_cq *cq, struct ibv_wc *wc)
{
	struct ibv_cq_ex *x = (struct ibv_cq_ex *)cq;
	struct ibv_poll_cq_attr attr = { 0 };
	int ret = ibv_start_poll(x, &attr);
	if (ret)
		return ret == ENOENT ? 0 : -ret;
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = x->wr_id;
	wc->status = x->status;
	wc->qp_num = ibv_wc_read_qp_num(x);
	if (wc->status == IBV_WC_SUCCESS) {
		wc->opcode = ibv_wc_read_opcode(x);
		wc->byte_len = ibv_wc_read_byte_len(x);
		wc->wc_flags = ibv_wc_read_wc_flags(x);
		if (wc->wc_flags & (IBV_WC_WITH_IMM | IBV_WC_WITH_INV))
			wc->imm_data = ibv_wc_read_imm_data(x);
		wc->src_qp = ibv_wc_read_src_qp(x);
	}
	ibv_end_poll(x);
	return 1;
}

static int poll_into(struct obj *o, struct wc_line *lines, int have, int want)
{
	struct ibv_wc wc[16];
	int room = want - have, got;
	if (room > 16)
		room = 16;
	if (o->ex) {
		for (got = 0; got < room; got++) {
			int r = poll_ex(o->p, &wc[got]);
			if (r < 0)
				return r;
			if (!r)
				break;
		}
	} else {
		got = ibv_poll_cq(o->p, room, wc);
	}
	if (got < 0)
		return got;
	for (int i = 0; i < got; i++)
		format_wc(&wc[i], &lines[have + i]);
	return got;
}

/* ---- the verbs ---- */

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

/* Files the object a create verb returned under its reserved name; NULL is the verb's errno. */
static int created(struct obj *o, enum kind kind, void *p)
{
	if (!p)
		return errno;
	o->kind = kind;
	o->p = p;
	return 0;
}

static int verb_pd(struct args *a)
{
	struct obj *o = make(pos(a, 0));
	if (!o || bad_arg)
		return (bad_arg = 1);
	return created(o, K_PD, ibv_alloc_pd(ctx));
}

static int verb_mr(struct args *a)
{
	const char *name = pos(a, 0);
	struct obj *pd = obj_arg(pos(a, 1), K_PD), *o;
	size_t len = num(pos(a, 2));
	unsigned access = parse_flags(pos(a, 3), access_names);
	struct ibv_mr *mr;
	char *buf;
	if (bad_arg || len > (1 << 24) || !(o = make(name)))
		return (bad_arg = 1);
	buf = aligned_alloc(4096, (len + 4095) / 4096 * 4096 + 4096);
	memset(buf, 0, len);
	mr = ibv_reg_mr(pd->p, buf, len, access);
	if (!mr) {
		free(buf);
		return errno;
	}
	o->kind = K_MR;
	o->p = mr;
	o->buf = buf;
	o->len = len;
	return 0;
}

static int verb_cq(struct args *a)
{
	const char *name = pos(a, 0);
	int cqe = num(pos(a, 1));
	const char *ch = opt(a, "chan");
	struct obj *chan = ch ? obj_arg(ch, K_CHAN) : NULL, *o;
	if (bad_arg || !(o = make(name)))
		return (bad_arg = 1);
	if (flag(a, "ex")) {
		struct ibv_cq_init_attr_ex init = {
			.cqe = cqe,
			.channel = chan ? chan->p : NULL,
			.wc_flags = IBV_WC_STANDARD_FLAGS,
		};
		struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &init);
		o->ex = 1;
		return created(o, K_CQ, cq ? ibv_cq_ex_to_cq(cq) : NULL);
	}
	return created(o, K_CQ, ibv_create_cq(ctx, cqe, NULL, chan ? chan->p : NULL, 0));
}

static int verb_chan(struct args *a)
{
	struct obj *o = make(pos(a, 0));
	int ret;
	if (!o || bad_arg)
		return (bad_arg = 1);
	ret = created(o, K_CHAN, ibv_create_comp_channel(ctx));
	if (!ret) {
		struct ibv_comp_channel *ch = o->p;
		fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
	}
	return ret;
}

static int verb_srq(struct args *a)
{
	const char *name = pos(a, 0);
	struct obj *pd = obj_arg(pos(a, 1), K_PD), *o;
	struct ibv_srq_init_attr init = { 0 };
	init.attr.max_wr = num(pos(a, 2));
	init.attr.max_sge = num(pos(a, 3));
	init.attr.srq_limit = opt_num(a, "limit", 0);
	if (bad_arg || !(o = make(name)))
		return (bad_arg = 1);
	return created(o, K_SRQ, ibv_create_srq(pd->p, &init));
}

/* The send operations an extended QP of `type` is made with: every one rxe's provider takes for
 * the type (rdma-core 44's RXE_SUP_*_QP_SEND_OPS_FLAGS) but ATOMIC_WRITE, which the kernel's
 * rxe of Debian 12 does not carry. */
static uint64_t ex_send_ops(int type)
{
	uint64_t ud = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
	uint64_t uc = ud | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
		      IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_SEND_WITH_INV;
	switch (type) {
	case IBV_QPT_UD:
		return ud;
	case IBV_QPT_UC:
		return uc;
	default:
		return uc | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
		       IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_LOCAL_INV;
	}
}

static int verb_qp(struct args *a)
{
	const char *name = pos(a, 0);
	int type = named_value(qp_type_names, pos(a, 1));
	struct obj *pd = obj_arg(pos(a, 2), K_PD), *scq = obj_arg(pos(a, 3), K_CQ),
		   *rcq = obj_arg(pos(a, 4), K_CQ), *srq = NULL, *o;
	const char *s = opt(a, "srq");
	struct ibv_qp_init_attr init = { 0 };
	if (s)
		srq = obj_arg(s, K_SRQ);
	init.qp_type = type;
	init.send_cq = scq ? scq->p : NULL;
	init.recv_cq = rcq ? rcq->p : NULL;
	init.srq = srq ? srq->p : NULL;
	init.cap.max_send_wr = opt_num(a, "sq", 8);
	init.cap.max_recv_wr = srq ? 0 : opt_num(a, "rq", 8);
	init.cap.max_send_sge = opt_num(a, "ssge", 2);
	init.cap.max_recv_sge = srq ? 0 : opt_num(a, "rsge", 2);
	init.cap.max_inline_data = opt_num(a, "inline", 0);
	init.sq_sig_all = flag(a, "sigall");
	if (bad_arg || !(o = make(name)))
		return (bad_arg = 1);
	o->qp_type = type;
	o->sig_all = init.sq_sig_all;
	if (flag(a, "ex")) {
		struct ibv_qp_init_attr_ex ex = {
			.qp_type = init.qp_type,
			.send_cq = init.send_cq,
			.recv_cq = init.recv_cq,
			.srq = init.srq,
			.cap = init.cap,
			.sq_sig_all = init.sq_sig_all,
			.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
			.pd = pd->p,
			.send_ops_flags = ex_send_ops(type),
		};
		o->ex = 1;
		return created(o, K_QP, ibv_create_qp_ex(ctx, &ex));
	}
	return created(o, K_QP, ibv_create_qp(pd->p, &init));
}

/*
 * Multicast group N: 239.1.2.N as an IPv4-mapped GID when the port's GID is one (RoCE v2 over
 * IPv4), ff0e::N otherwise. The runner also joins the IPv4 group on the host (once per group):
 * the kernel's rxe adds only the group's MAC on ibv_attach_mcast, and the kernel loops a
 * datagram sent to a group back to this host only when the host is a member (librdmacm's
 * rdma_join_multicast joins it so). The emulator does not look at it.
 */
static int mcast_gid(const char *arg, union ibv_gid *g)
{
	unsigned n = num(arg);
	static int sock = -1;
	static unsigned char joined[256];
	if (bad_arg || n > 255 || ibv_query_gid(ctx, 1, gid_index, g))
		return (bad_arg = 1);
	int v4 = !memcmp(g->raw, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12);
	struct ip_mreqn m = { .imr_multiaddr.s_addr = htonl(0xef010200 | n) };
	memcpy(&m.imr_address, g->raw + 12, 4); /* the port's own address: its interface */
	memset(g->raw, 0, sizeof(g->raw));
	if (!v4) {
		g->raw[0] = 0xff;
		g->raw[1] = 0x0e;
		g->raw[15] = n;
		return 0;
	}
	g->raw[10] = g->raw[11] = 0xff;
	g->raw[12] = 239, g->raw[13] = 1, g->raw[14] = 2, g->raw[15] = n;
	if (sock < 0)
		sock = socket(AF_INET, SOCK_DGRAM, 0);
	if (sock >= 0 && !joined[n])
		joined[n] = !setsockopt(sock, IPPROTO_IP, IP_ADD_MEMBERSHIP, &m, sizeof(m));
	return 0;
}

static int verb_ah(struct args *a)
{
	const char *name = pos(a, 0), *group = opt(a, "mcast");
	struct obj *pd = obj_arg(pos(a, 1), K_PD), *o;
	struct ibv_ah_attr attr = { .port_num = opt_num(a, "port", 1), .is_global = 1 };
	attr.grh.sgid_index = opt_num(a, "gid", gid_index);
	attr.grh.hop_limit = 64;
	if (bad_arg || !(o = make(name)))
		return (bad_arg = 1);
	if (group ? mcast_gid(group, &attr.grh.dgid) : ibv_query_gid(ctx, 1, gid_index, &attr.grh.dgid))
		return group ? 1 : errno;
	return created(o, K_AH, ibv_create_ah(pd->p, &attr));
}

/* attach_mcast / detach_mcast QP N [lid=L] */
static int verb_mcast(struct args *a, int attach)
{
	struct obj *q = obj_arg(pos(a, 0), K_QP);
	union ibv_gid g;
	uint16_t lid = opt_num(a, "lid", 0);
	if (bad_arg || mcast_gid(pos(a, 1), &g))
		return (bad_arg = 1);
	return attach ? ibv_attach_mcast(q->p, &g, lid) : ibv_detach_mcast(q->p, &g, lid);
}

static int verb_mw(struct args *a)
{
	const char *name = pos(a, 0);
	struct obj *pd = obj_arg(pos(a, 1), K_PD), *o;
	int type = num(pos(a, 2)), ret;
	if (bad_arg || !(o = make(name)))
		return (bad_arg = 1);
	ret = created(o, K_MW, ibv_alloc_mw(pd->p, type == 1 ? IBV_MW_TYPE_1 : type == 2 ? IBV_MW_TYPE_2 : type));
	if (!ret)
		o->mw_rkey = ((struct ibv_mw *)o->p)->rkey;
	return ret;
}

/* Destroys `o` with its kind's verb; it stays if the verb fails. */
static int destroy(struct obj *o)
{
	int ret;
	switch (o->kind) {
	case K_PD: ret = ibv_dealloc_pd(o->p); break;
	case K_MR: ret = ibv_dereg_mr(o->p); break;
	case K_CQ: ret = ibv_destroy_cq(o->p); break;
	case K_CHAN: ret = ibv_destroy_comp_channel(o->p); break;
	case K_QP: ret = ibv_destroy_qp(o->p); break;
	case K_SRQ: ret = ibv_destroy_srq(o->p); break;
	case K_AH: ret = ibv_destroy_ah(o->p); break;
	case K_MW: ret = ibv_dealloc_mw(o->p); break;
	default: return EINVAL;
	}
	if (ret)
		return ret < 0 ? errno : ret;
	if (o->kind == K_QP)
		forget_pending(o);
	free(o->buf);
	o->kind = K_NONE;
	return 0;
}

static int verb_destroy(struct args *a, enum kind kind)
{
	struct obj *o = obj_arg(pos(a, 0), kind);
	if (bad_arg)
		return 1;
	return destroy(o);
}

static int verb_modify(struct args *a)
{
	struct obj *q = obj_arg(pos(a, 0), K_QP);
	int state = named_value(qp_state_names, pos(a, 1));
	struct ibv_qp_attr attr = { 0 };
	int mask = IBV_QP_STATE, type, uc_rc;
	const char *v, *omit = opt(a, "omit");
	if (bad_arg)
		return 1;
	type = q->qp_type;
	uc_rc = type == IBV_QPT_RC || type == IBV_QPT_UC;
	attr.qp_state = state;
	if (state == IBV_QPS_INIT) {
		attr.pkey_index = opt_num(a, "pkey", 0);
		attr.port_num = opt_num(a, "port", 1);
		mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT;
		if (uc_rc) {
			v = opt(a, "access");
			attr.qp_access_flags = parse_flags(v ? v : type == IBV_QPT_RC ? "LW|RW|RR|RA" : "LW|RW",
							   access_names);
			mask |= IBV_QP_ACCESS_FLAGS;
		} else {
			attr.qkey = opt_num(a, "qkey", 0x11111111);
			mask |= IBV_QP_QKEY;
		}
	} else if (state == IBV_QPS_RTR && uc_rc) {
		struct obj *dest = NULL;
		v = opt(a, "dest");
		if (v)
			dest = obj_arg(v, K_QP);
		if (bad_arg)
			return 1;
		attr.path_mtu = named_value(mtu_names, (v = opt(a, "mtu")) ? v : "1024");
		attr.dest_qp_num = dest ? ((struct ibv_qp *)dest->p)->qp_num : 0xffffff;
		attr.rq_psn = opt_num(a, "rq_psn", 0);
		attr.ah_attr.is_global = 1;
		attr.ah_attr.port_num = 1;
		attr.ah_attr.grh.sgid_index = gid_index;
		attr.ah_attr.grh.hop_limit = 64;
		if (ibv_query_gid(ctx, 1, gid_index, &attr.ah_attr.grh.dgid))
			return errno;
		mask |= IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_AV;
		if (type == IBV_QPT_RC) {
			attr.max_dest_rd_atomic = opt_num(a, "dest_rd_atomic", 1);
			attr.min_rnr_timer = opt_num(a, "min_rnr", 1);
			mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		}
	} else if (state == IBV_QPS_RTR && (v = opt(a, "mtu"))) {
		/* UD takes no path MTU: asking for one is an invalid attribute. */
		attr.path_mtu = named_value(mtu_names, v);
		mask |= IBV_QP_PATH_MTU;
	} else if (state == IBV_QPS_RTS) {
		attr.sq_psn = opt_num(a, "sq_psn", 0);
		mask |= IBV_QP_SQ_PSN;
		if (type == IBV_QPT_RC) {
			attr.timeout = opt_num(a, "timeout", 10);
			attr.retry_cnt = opt_num(a, "retry", 1);
			attr.rnr_retry = opt_num(a, "rnr_retry", 0);
			attr.max_rd_atomic = opt_num(a, "rd_atomic", 1);
			mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				IBV_QP_MAX_QP_RD_ATOMIC;
		}
	}
	if (omit) {
		static const struct named attr_names[] = {
			{ "state", IBV_QP_STATE },	      { "pkey", IBV_QP_PKEY_INDEX },
			{ "port", IBV_QP_PORT },	      { "access", IBV_QP_ACCESS_FLAGS },
			{ "qkey", IBV_QP_QKEY },	      { "mtu", IBV_QP_PATH_MTU },
			{ "dest", IBV_QP_DEST_QPN },	      { "rq_psn", IBV_QP_RQ_PSN },
			{ "av", IBV_QP_AV },		      { "dest_rd_atomic", IBV_QP_MAX_DEST_RD_ATOMIC },
			{ "min_rnr", IBV_QP_MIN_RNR_TIMER }, { "sq_psn", IBV_QP_SQ_PSN },
			{ "timeout", IBV_QP_TIMEOUT },	      { "retry", IBV_QP_RETRY_CNT },
			{ "rnr_retry", IBV_QP_RNR_RETRY },    { "rd_atomic", IBV_QP_MAX_QP_RD_ATOMIC },
			{ NULL, 0 },
		};
		mask &= ~parse_flags(omit, attr_names);
	}
	if (bad_arg)
		return 1;
	return ibv_modify_qp(q->p, &attr, mask);
}

static int verb_query_qp(struct args *a)
{
	struct obj *q = obj_arg(pos(a, 0), K_QP);
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	int ret;
	if (bad_arg)
		return 1;
	ret = ibv_query_qp(q->p, &attr, IBV_QP_STATE, &init);
	if (!ret)
		snprintf(line_out, sizeof(line_out), " state=%s", lookup(qp_state_names, attr.qp_state));
	return ret;
}

static int verb_query_port(struct args *a)
{
	struct ibv_port_attr pa;
	int ret = ibv_query_port(ctx, opt_num(a, "port", 1), &pa);
	if (!ret)
		snprintf(line_out, sizeof(line_out),
			 " state=%s max_mtu=%s active_mtu=%s gid_tbl_len=%d pkey_tbl_len=%u link=%u "
			 "max_msg_sz=%u",
			 ibv_port_state_str(pa.state), lookup(mtu_names, pa.max_mtu),
			 lookup(mtu_names, pa.active_mtu), pa.gid_tbl_len, pa.pkey_tbl_len,
			 pa.link_layer, pa.max_msg_sz);
	return ret;
}

static int verb_query_device(struct args *a)
{
	struct ibv_device_attr d;
	int ret = ibv_query_device(ctx, &d);
	(void)a;
	if (!ret)
		snprintf(line_out, sizeof(line_out),
			 " max_qp_wr=%d max_sge=%d max_sge_rd=%d max_cqe=%d max_srq_wr=%d "
			 "max_srq_sge=%d max_qp_rd_atom=%d atomic_cap=%d ports=%u",
			 d.max_qp_wr, d.max_sge, d.max_sge_rd, d.max_cqe, d.max_srq_wr, d.max_srq_sge,
			 d.max_qp_rd_atom, d.atomic_cap, d.phys_port_cnt);
	return ret;
}

/* `sge=MR:OFF:LEN,...` (or `sge=none`) into `sge`; returns the count. `lkey=bad` spoils the
 * first entry's key. */
static int parse_sges(struct args *a, struct ibv_sge *sge, int max)
{
	const char *v = opt(a, "sge");
	char buf[512];
	int n = 0;
	if (!v || !strcmp(v, "none"))
		return 0;
	snprintf(buf, sizeof(buf), "%s", v);
	for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		char name[32];
		unsigned long long off, len;
		struct obj *mr;
		if (n == max || sscanf(t, "%31[^:]:%llu:%llu", name, &off, &len) != 3) {
			bad_arg = 1;
			return 0;
		}
		mr = obj_arg(name, K_MR);
		if (!mr)
			return 0;
		sge[n].addr = (uintptr_t)mr->buf + off;
		sge[n].length = len;
		sge[n].lkey = ((struct ibv_mr *)mr->p)->lkey;
		n++;
	}
	v = opt(a, "lkey");
	if (v && !strcmp(v, "bad") && n)
		sge[0].lkey ^= 0x80;
	return n;
}

/* `remote=MR:OFF` or `remote=MW:OFF` (offset into the bound window): address and rkey. */
static void parse_remote(struct args *a, uint64_t *addr, uint32_t *rkey)
{
	const char *v = opt(a, "remote");
	char name[32];
	unsigned long long off;
	struct obj *o;
	if (!v)
		return;
	if (sscanf(v, "%31[^:]:%llu", name, &off) != 2) {
		bad_arg = 1;
		return;
	}
	o = find(name, K_NONE);
	if (o && o->kind == K_MR) {
		*addr = (uintptr_t)o->buf + off;
		*rkey = ((struct ibv_mr *)o->p)->rkey;
	} else if (o && o->kind == K_MW) {
		*addr = o->mw_addr + off;
		*rkey = o->mw_rkey;
	} else {
		bad_arg = 1;
	}
	v = opt(a, "rkey");
	if (v && !strcmp(v, "bad"))
		*rkey ^= 0x80;
}

static uint32_t key_of(const char *name)
{
	struct obj *o = find(name, K_NONE);
	if (o && o->kind == K_MW)
		return o->mw_rkey;
	if (o && o->kind == K_MR)
		return ((struct ibv_mr *)o->p)->rkey;
	bad_arg = 1;
	return 0;
}

/* `post_send` on an extended QP: the same requests built with ibv_wr_start, the opcode's
 * builder, its data (ibv_wr_set_sge for one SGE, ibv_wr_set_sge_list for none or more;
 * under IBV_SEND_INLINE, ibv_wr_set_inline_data and ibv_wr_set_inline_data_list) and its UD
 * address, and posted by ibv_wr_complete, which names no bad_wr. An operation the QP was not
 * made with has no builder (rxe's is NULL): EOPNOTSUPP here, on both sides. */
static int post_send_ex(struct obj *q, struct ibv_send_wr *wr, int count)
{
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(q->p);
	/* IBV_QP_EX_WITH_<op> is 1 << IBV_WR_<op> for every operation posted here. */
	if (!x || !(ex_send_ops(q->qp_type) & (1ULL << wr->opcode)))
		return EOPNOTSUPP;
	ibv_wr_start(x);
	for (int i = 0; i < count; i++) {
		struct ibv_send_wr *w = &wr[i];
		struct ibv_data_buf data[4];
		int with_data = 1;
		x->wr_id = w->wr_id;
		x->wr_flags = w->send_flags;
		switch (w->opcode) {
		case IBV_WR_RDMA_WRITE:
			ibv_wr_rdma_write(x, w->wr.rdma.rkey, w->wr.rdma.remote_addr);
			break;
		case IBV_WR_RDMA_WRITE_WITH_IMM:
			ibv_wr_rdma_write_imm(x, w->wr.rdma.rkey, w->wr.rdma.remote_addr, w->imm_data);
			break;
		case IBV_WR_RDMA_READ:
			ibv_wr_rdma_read(x, w->wr.rdma.rkey, w->wr.rdma.remote_addr);
			break;
		case IBV_WR_SEND:
			ibv_wr_send(x);
			break;
		case IBV_WR_SEND_WITH_IMM:
			ibv_wr_send_imm(x, w->imm_data);
			break;
		case IBV_WR_SEND_WITH_INV:
			ibv_wr_send_inv(x, w->invalidate_rkey);
			break;
		case IBV_WR_ATOMIC_CMP_AND_SWP:
			ibv_wr_atomic_cmp_swp(x, w->wr.atomic.rkey, w->wr.atomic.remote_addr,
					      w->wr.atomic.compare_add, w->wr.atomic.swap);
			break;
		case IBV_WR_ATOMIC_FETCH_AND_ADD:
			ibv_wr_atomic_fetch_add(x, w->wr.atomic.rkey, w->wr.atomic.remote_addr,
						w->wr.atomic.compare_add);
			break;
		case IBV_WR_LOCAL_INV:
			ibv_wr_local_inv(x, w->invalidate_rkey);
			with_data = 0;
			break;
		case IBV_WR_BIND_MW:
			ibv_wr_bind_mw(x, w->bind_mw.mw, w->bind_mw.rkey, &w->bind_mw.bind_info);
			with_data = 0;
			break;
		default:
			ibv_wr_abort(x);
			return EOPNOTSUPP;
		}
		/* A UD request without ah= is built without an address (rxe takes it). */
		if (q->qp_type == IBV_QPT_UD && w->wr.ud.ah)
			ibv_wr_set_ud_addr(x, w->wr.ud.ah, w->wr.ud.remote_qpn, w->wr.ud.remote_qkey);
		if (!with_data)
			continue;
		if (w->send_flags & IBV_SEND_INLINE && w->num_sge == 1) {
			ibv_wr_set_inline_data(x, (void *)(uintptr_t)w->sg_list[0].addr,
					       w->sg_list[0].length);
		} else if (w->send_flags & IBV_SEND_INLINE) {
			for (int j = 0; j < w->num_sge; j++) {
				data[j].addr = (void *)(uintptr_t)w->sg_list[j].addr;
				data[j].length = w->sg_list[j].length;
			}
			ibv_wr_set_inline_data_list(x, w->num_sge, data);
		} else if (w->num_sge == 1) {
			ibv_wr_set_sge(x, w->sg_list[0].lkey, w->sg_list[0].addr, w->sg_list[0].length);
		} else {
			ibv_wr_set_sge_list(x, w->num_sge, w->sg_list);
		}
	}
	return ibv_wr_complete(x);
}

static int verb_post_send(struct args *a)
{
	struct obj *q = obj_arg(pos(a, 0), K_QP);
	unsigned op = named_value(opcode_names, pos(a, 1));
	struct ibv_send_wr wr[MAX_CHAIN], *bad = NULL;
	struct ibv_sge sge[MAX_CHAIN][4];
	int count = opt_num(a, "count", 1), nsge, ret;
	uint64_t wr_id = opt_num(a, "wr", 0), addr = 0;
	uint32_t rkey = 0;
	struct ibv_send_wr base = { 0 };
	const char *v;
	struct obj *mw = NULL;

	if (bad_arg || count < 1 || count > MAX_CHAIN)
		return (bad_arg = 1);
	nsge = parse_sges(a, sge[0], 4);
	parse_remote(a, &addr, &rkey);
	base.opcode = op;
	base.num_sge = nsge;
	base.send_flags = (v = opt(a, "flags")) ? parse_flags(v, send_flag_names) : IBV_SEND_SIGNALED;
	if ((v = opt(a, "imm")))
		base.imm_data = htonl(num(v));
	switch (op) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_RDMA_READ:
		base.wr.rdma.remote_addr = addr;
		base.wr.rdma.rkey = rkey;
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		base.wr.atomic.remote_addr = addr;
		base.wr.atomic.rkey = rkey;
		base.wr.atomic.compare_add = opt_num(a, op == IBV_WR_ATOMIC_FETCH_AND_ADD ? "add" : "cmp", 0);
		base.wr.atomic.swap = opt_num(a, "swap", 0);
		break;
	case IBV_WR_SEND_WITH_INV:
	case IBV_WR_LOCAL_INV:
		base.invalidate_rkey = key_of((v = opt(a, "inv")) ? v : "");
		break;
	case IBV_WR_BIND_MW: {
		struct obj *mr = obj_arg((v = opt(a, "mr")) ? v : "", K_MR);
		mw = obj_arg((v = opt(a, "mw")) ? v : "", K_MW);
		if (bad_arg)
			return 1;
		base.bind_mw.mw = mw->p;
		base.bind_mw.rkey = ibv_inc_rkey(mw->mw_rkey);
		base.bind_mw.bind_info.mr = mr->p;
		base.bind_mw.bind_info.addr = (uintptr_t)mr->buf + opt_num(a, "off", 0);
		base.bind_mw.bind_info.length = opt_num(a, "len", 0);
		base.bind_mw.bind_info.mw_access_flags =
			parse_flags((v = opt(a, "access")) ? v : "0", access_names);
		break;
	}
	default:
		break;
	}
	if ((v = opt(a, "ah"))) {
		/* To a multicast group (`mcast`): the multicast QPN, no destination QP. */
		int group = flag(a, "mcast");
		struct obj *ah = obj_arg(v, K_AH), *dq = group ? NULL : obj_arg((v = opt(a, "dqp")) ? v : "", K_QP);
		if (bad_arg)
			return 1;
		base.wr.ud.ah = ah->p;
		base.wr.ud.remote_qpn = group ? 0xffffff : ((struct ibv_qp *)dq->p)->qp_num;
		base.wr.ud.remote_qkey = opt_num(a, "qkey", 0x11111111);
	}
	if (bad_arg)
		return 1;
	for (int i = 0; i < count; i++) {
		wr[i] = base;
		wr[i].wr_id = wr_id + i;
		memcpy(sge[i], sge[0], sizeof(sge[0]));
		wr[i].sg_list = sge[i];
		wr[i].next = i + 1 < count ? &wr[i + 1] : NULL;
	}
	/* An extended QP's batch names no failed WR: none of it is counted on a failure. */
	ret = q->ex ? post_send_ex(q, wr, count) : ibv_post_send(q->p, wr, &bad);
	for (int i = 0; i < count && !(ret && (q->ex || bad == &wr[i])); i++)
		add_pending(q, 0, q->sig_all || (wr[i].send_flags & IBV_SEND_SIGNALED), wr[i].wr_id);
	if (ret && bad)
		snprintf(line_out, sizeof(line_out), " bad=%llu", (unsigned long long)bad->wr_id);
	if (!ret && mw) {
		mw->mw_rkey = base.bind_mw.rkey;
		mw->mw_addr = base.bind_mw.bind_info.addr;
	}
	return ret;
}

static int post_recv(struct args *a, struct obj *q, struct obj *srq)
{
	struct ibv_recv_wr wr[MAX_CHAIN], *bad = NULL;
	struct ibv_sge sge[MAX_CHAIN][4];
	int count = opt_num(a, "count", 1), nsge, ret;
	uint64_t wr_id = opt_num(a, "wr", 0);
	if (bad_arg || count < 1 || count > MAX_CHAIN)
		return (bad_arg = 1);
	nsge = parse_sges(a, sge[0], 4);
	if (bad_arg)
		return 1;
	for (int i = 0; i < count; i++) {
		memset(&wr[i], 0, sizeof(wr[i]));
		wr[i].wr_id = wr_id + i;
		memcpy(sge[i], sge[0], sizeof(sge[0]));
		wr[i].sg_list = sge[i];
		wr[i].num_sge = nsge;
		wr[i].next = i + 1 < count ? &wr[i + 1] : NULL;
	}
	ret = q ? ibv_post_recv(q->p, wr, &bad) : ibv_post_srq_recv(srq->p, wr, &bad);
	for (int i = 0; q && i < count && !(ret && bad == &wr[i]); i++)
		add_pending(q, 1, 1, wr[i].wr_id);
	if (ret && bad)
		snprintf(line_out, sizeof(line_out), " bad=%llu", (unsigned long long)bad->wr_id);
	return ret;
}

static int verb_bind_mw(struct args *a)
{
	struct obj *mw = obj_arg(pos(a, 0), K_MW), *q = obj_arg(pos(a, 1), K_QP),
		   *mr = obj_arg(pos(a, 2), K_MR);
	uint64_t off = num(pos(a, 3)), len = num(pos(a, 4));
	unsigned access = parse_flags(pos(a, 5), access_names);
	struct ibv_mw_bind bind = { 0 };
	const char *v;
	int ret;
	if (bad_arg)
		return 1;
	bind.wr_id = opt_num(a, "wr", 0);
	bind.send_flags = (v = opt(a, "flags")) ? parse_flags(v, send_flag_names) : IBV_SEND_SIGNALED;
	bind.bind_info.mr = mr->p;
	bind.bind_info.addr = (uintptr_t)mr->buf + off;
	bind.bind_info.length = len;
	bind.bind_info.mw_access_flags = access;
	ret = ibv_bind_mw(q->p, mw->p, &bind);
	if (!ret)
		add_pending(q, 0, q->sig_all || (bind.send_flags & IBV_SEND_SIGNALED), bind.wr_id);
	if (!ret) {
		mw->mw_rkey = ((struct ibv_mw *)mw->p)->rkey;
		mw->mw_addr = bind.bind_info.addr;
	}
	return ret;
}

/* How many completions `cq` still owes: every signaled send WR posted on a QP whose send CQ it
 * is, and, once such a QP is in ERR (where every WR flushes), its posted receives too. */
static int owed(struct ibv_cq *cq)
{
	int n = 0;
	for (int i = 0; i < n_pending; i++) {
		struct ibv_qp *qp = objs[pending[i].obj].p;
		if (pending[i].recv) {
			struct ibv_qp_attr attr;
			struct ibv_qp_init_attr init;
			if (qp->recv_cq == cq && !ibv_query_qp(qp, &attr, IBV_QP_STATE, &init) &&
			    attr.qp_state == IBV_QPS_ERR)
				n++;
		} else if (pending[i].signaled && qp->send_cq == cq) {
			n++;
		}
	}
	return n;
}

/* `poll CQ N` polls until N completions came or the timeout passed. `poll CQ` polls until the
 * CQ owes nothing (see owed()) and stayed empty for the settle time, or the timeout passed. */
static int verb_poll(struct args *a)
{
	struct obj *cq = obj_arg(pos(a, 0), K_CQ);
	int counted = a->n > 2, want = counted ? (int)num(pos(a, 1)) : MAX_WC, have = 0, got;
	struct wc_line lines[MAX_WC];
	long deadline = now_ms() + timeout_ms, quiet_until = now_ms() + settle_ms;
	if (bad_arg || want > MAX_WC)
		return (bad_arg = 1);
	while (have < want) {
		got = poll_into(cq, lines, have, want);
		if (got < 0) {
			out(" => poll error %d\n", got);
			return PRINTED;
		}
		have += got;
		if (got) {
			quiet_until = now_ms() + settle_ms;
			continue;
		}
		if (now_ms() > deadline) {
			fprintf(stderr, "runner: %s: %s timed out\n", program_name, a->tok[0]);
			break;
		}
		if (!counted && now_ms() >= quiet_until && !owed(cq->p))
			break;
		sleep_ms(1);
	}
	out(" => %d\n", have);
	print_wcs(lines, have);
	return PRINTED;
}

static int verb_notify(struct args *a)
{
	struct obj *cq = obj_arg(pos(a, 0), K_CQ);
	int sol = flag(a, "sol");
	if (bad_arg)
		return 1;
	return ibv_req_notify_cq(cq->p, sol);
}

static int verb_cq_event(struct args *a)
{
	struct obj *ch = obj_arg(pos(a, 0), K_CHAN);
	struct ibv_comp_channel *chan;
	struct pollfd pfd;
	struct ibv_cq *cq;
	void *cq_ctx;
	if (bad_arg)
		return 1;
	chan = ch->p;
	pfd.fd = chan->fd;
	pfd.events = POLLIN;
	if (poll(&pfd, 1, settle_ms) <= 0) {
		out(" => none\n");
		return PRINTED;
	}
	if (ibv_get_cq_event(chan, &cq, &cq_ctx))
		return errno;
	ibv_ack_cq_events(cq, 1);
	out(" => %s\n", name_of(cq));
	return PRINTED;
}

static int cmp_str(const void *x, const void *y)
{
	return strcmp(x, y);
}

static int verb_events(struct args *a)
{
	char names[32][96];
	int n = 0;
	struct pollfd pfd = { .fd = ctx->async_fd, .events = POLLIN };
	(void)a;
	while (n < 32 && poll(&pfd, 1, settle_ms) > 0) {
		struct ibv_async_event ev;
		const char *obj = "";
		if (ibv_get_async_event(ctx, &ev))
			break;
		switch (ev.event_type) {
		case IBV_EVENT_CQ_ERR: obj = name_of(ev.element.cq); break;
		case IBV_EVENT_SRQ_ERR:
		case IBV_EVENT_SRQ_LIMIT_REACHED: obj = name_of(ev.element.srq); break;
		case IBV_EVENT_PORT_ACTIVE:
		case IBV_EVENT_PORT_ERR:
		case IBV_EVENT_LID_CHANGE:
		case IBV_EVENT_PKEY_CHANGE:
		case IBV_EVENT_GID_CHANGE:
		case IBV_EVENT_SM_CHANGE:
		case IBV_EVENT_CLIENT_REREGISTER: obj = "port"; break;
		case IBV_EVENT_DEVICE_FATAL: obj = "device"; break;
		default: obj = name_of(ev.element.qp); break;
		}
		/* The host's addresses coming and going (IPv6 autoconfiguration in the VM) change
		 * RoCE GID tables: the environment's doing, not the program's. So is a port coming
		 * up: no verb here changes a port's state, and rxe raises PORT_ACTIVE on every
		 * NETDEV_CHANGE of its netdev, its port active all along (live run, seed 75013: one
		 * in the VM's third program, long after the warmup). */
		if (ev.event_type != IBV_EVENT_GID_CHANGE && ev.event_type != IBV_EVENT_PORT_ACTIVE)
			snprintf(names[n++], sizeof(names[0]), "%s %s", lookup(event_names, ev.event_type), obj);
		ibv_ack_async_event(&ev);
	}
	qsort(names, n, sizeof(names[0]), cmp_str);
	out(" => %d\n", n);
	for (int i = 0; i < n; i++)
		out("  %s\n", names[i]);
	return PRINTED;
}

static int verb_modify_srq(struct args *a)
{
	struct obj *s = obj_arg(pos(a, 0), K_SRQ);
	struct ibv_srq_attr attr = { 0 };
	int mask = 0;
	const char *v;
	if ((v = opt(a, "max_wr"))) {
		attr.max_wr = num(v);
		mask |= IBV_SRQ_MAX_WR;
	}
	if ((v = opt(a, "limit"))) {
		attr.srq_limit = num(v);
		mask |= IBV_SRQ_LIMIT;
	}
	if (bad_arg)
		return 1;
	return ibv_modify_srq(s->p, &attr, mask);
}

static int verb_query_srq(struct args *a)
{
	struct obj *s = obj_arg(pos(a, 0), K_SRQ);
	struct ibv_srq_attr attr;
	int ret;
	if (bad_arg)
		return 1;
	ret = ibv_query_srq(s->p, &attr);
	if (!ret)
		snprintf(line_out, sizeof(line_out), " limit=%u", attr.srq_limit);
	return ret;
}

static int verb_resize_cq(struct args *a)
{
	struct obj *cq = obj_arg(pos(a, 0), K_CQ);
	int cqe = num(pos(a, 1));
	if (bad_arg)
		return 1;
	return ibv_resize_cq(cq->p, cqe);
}

static int verb_fill(struct args *a)
{
	struct obj *mr = obj_arg(pos(a, 0), K_MR);
	size_t off = num(pos(a, 1)), len = num(pos(a, 2));
	unsigned seed = num(pos(a, 3));
	if (bad_arg || off + len > mr->len)
		return (bad_arg = 1);
	for (size_t i = 0; i < len; i++)
		mr->buf[off + i] = (char)(seed + i);
	return 0;
}

static int verb_dump(struct args *a)
{
	struct obj *mr = obj_arg(pos(a, 0), K_MR);
	size_t off = num(pos(a, 1)), len = num(pos(a, 2)), n = 1;
	if (bad_arg || off + len > mr->len || len > 1024)
		return (bad_arg = 1);
	line_out[0] = ' ';
	for (size_t i = 0; i < len; i++)
		n += snprintf(line_out + n, sizeof(line_out) - n, "%02x", (unsigned char)mr->buf[off + i]);
	return 0;
}

/* ---- programs ---- */

static void cleanup(void)
{
	static const enum kind order[] = { K_QP, K_SRQ, K_MW, K_AH, K_MR, K_CQ, K_CHAN, K_PD };
	for (unsigned k = 0; k < sizeof(order) / sizeof(order[0]); k++)
		for (int i = 0; i < MAX_OBJS; i++)
			if (objs[i].kind == order[k]) {
				int ret = destroy(&objs[i]);
				if (ret) {
					out("  cleanup %s => %s\n", objs[i].name, err_name(ret));
					objs[i].kind = K_NONE;
				}
			}
	n_pending = 0;
	if (ctx)
		ibv_close_device(ctx);
	ctx = NULL;
}

static void call(char *line)
{
	struct args a = { 0 };
	const char *verb;
	int ret;
	for (char *save, *t = strtok_r(line, " \t\n", &save); t && a.n < MAX_TOKS;
	     t = strtok_r(NULL, " \t\n", &save))
		a.tok[a.n++] = t;
	if (!a.n || a.tok[0][0] == '#')
		return;
	verb = a.tok[0];
	for (int i = 0; i < a.n; i++)
		out("%s%s", i ? " " : "", a.tok[i]);
	fflush(stdout);
	bad_arg = 0;
	line_out[0] = 0;
	if (!strcmp(verb, "program")) {
		out("\n");
		snprintf(program_name, sizeof(program_name), "%s", a.n > 1 ? a.tok[1] : "");
		cleanup();
		ctx = ibv_open_device(dev);
		if (!ctx)
			out("open => %s\n", err_name(errno));
		return;
	}
	if (!strcmp(verb, "end")) {
		/* What the program left behind is destroyed here; a failure shows under `end`. */
		out("\n");
		cleanup();
		fflush(stdout);
		return;
	}
	if (!ctx) {
		out(" => NOCONTEXT\n");
		return;
	}
#define V(name, fn) else if (!strcmp(verb, name)) ret = fn
	if (0)
		ret = 0;
	V("pd", verb_pd(&a));
	V("dealloc_pd", verb_destroy(&a, K_PD));
	V("mr", verb_mr(&a));
	V("dereg_mr", verb_destroy(&a, K_MR));
	V("cq", verb_cq(&a));
	V("resize_cq", verb_resize_cq(&a));
	V("destroy_cq", verb_destroy(&a, K_CQ));
	V("chan", verb_chan(&a));
	V("destroy_chan", verb_destroy(&a, K_CHAN));
	V("notify", verb_notify(&a));
	V("cq_event", verb_cq_event(&a));
	V("srq", verb_srq(&a));
	V("modify_srq", verb_modify_srq(&a));
	V("query_srq", verb_query_srq(&a));
	V("destroy_srq", verb_destroy(&a, K_SRQ));
	V("qp", verb_qp(&a));
	V("modify", verb_modify(&a));
	V("query_qp", verb_query_qp(&a));
	V("destroy_qp", verb_destroy(&a, K_QP));
	V("ah", verb_ah(&a));
	V("destroy_ah", verb_destroy(&a, K_AH));
	V("attach_mcast", verb_mcast(&a, 1));
	V("detach_mcast", verb_mcast(&a, 0));
	V("mw", verb_mw(&a));
	V("dealloc_mw", verb_destroy(&a, K_MW));
	V("bind_mw", verb_bind_mw(&a));
	V("post_send", verb_post_send(&a));
	V("post_recv", post_recv(&a, obj_arg(pos(&a, 0), K_QP), NULL));
	V("post_srq_recv", post_recv(&a, NULL, obj_arg(pos(&a, 0), K_SRQ)));
	V("poll", verb_poll(&a));
	V("events", verb_events(&a));
	V("query_port", verb_query_port(&a));
	V("query_device", verb_query_device(&a));
	V("fill", verb_fill(&a));
	V("dump", verb_dump(&a));
	else {
		out(" => UNKNOWN\n");
		return;
	}
#undef V
	for (int i = 1; i < a.n && !bad_arg; i++)
		if (!a.used[i])
			bad_arg = 1;
	if (ret == PRINTED && !bad_arg)
		return; /* the verb printed its own result */
	if (bad_arg)
		out(" => BADARG\n");
	else
		out(" => %s%s\n", err_name(ret < 0 ? errno : ret), line_out);
}

int main(void)
{
	struct ibv_device **list;
	char line[4096];
	int n;
	const char *v;

	setvbuf(stdout, NULL, _IOFBF, 1 << 16);
	if ((v = getenv("RUNNER_TIMEOUT_MS")))
		timeout_ms = atoi(v);
	if ((v = getenv("RUNNER_SETTLE_MS")))
		settle_ms = atoi(v);
	if ((v = getenv("RXE_GID_INDEX")))
		gid_index = atoi(v);
	list = ibv_get_device_list(&n);
	if (!list || !n) {
		fprintf(stderr, "runner: no RDMA device\n");
		return 2;
	}
	dev = list[0];
	while (fgets(line, sizeof(line), stdin))
		call(line);
	cleanup();
	ibv_free_device_list(list);
	return 0;
}
