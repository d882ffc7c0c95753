/* A fuzzer of the librdmacm C ABI (the connection manager and rsockets): random programs
 * with hostile arguments, each run in a forked child so that a crash, a hang or a panic is
 * caught, then minimised (harness.h).
 *
 *   cm_fuzz SEED CASES           run CASES programs from SEED; exit 1 if any failed
 *   cm_fuzz SEED CASES -v        the same, printing every call of every program
 *   CM_FUZZ_FIRST=N              start at case N (to rerun one found before)
 *   CM_FUZZ_SELF_TEST=1          every program that reads an event crashes after its calls
 *
 * A program is a list of calls on event channels, ids (its own and those connection requests
 * bring), events, PDs and rsockets, in one process: ids listen, resolve, connect to each
 * other, accept and reject, disconnect; rsockets bind, listen, connect, accept, move bytes.
 * Exported calls get hostile handles (NULL, destroyed, of another kind, junk; for rsockets
 * closed descriptors, a descriptor that is no rsocket, -1) as well as live ones, and hostile
 * values (socket addresses of other families or truncated, absurd lengths, backlogs, options
 * and timeouts). Nothing may block: channels and rsockets are non-blocking, polls do not
 * wait. A program fails when its process dies by a signal, does not finish within 10 s,
 * prints a Rust panic, or a call given a hostile handle succeeds. */
#define _GNU_SOURCE
#define FUZZ_ENV "CM_FUZZ"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <rdma/rsocket.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

/* ---- programs ---- */

enum op {
	OP_CREATE_CH, OP_DESTROY_CH, OP_CREATE_ID, OP_DESTROY_ID, OP_BIND, OP_RESOLVE_ADDR,
	OP_RESOLVE_ROUTE, OP_LISTEN, OP_CONNECT, OP_GET_EVENT, OP_ACK_EVENT, OP_ACCEPT,
	OP_REJECT, OP_DISCONNECT, OP_ALLOC_PD, OP_CREATE_QP, OP_DESTROY_QP, OP_SET_OPTION,
	OP_QUERY, OP_MULTICAST, OP_MIGRATE, OP_NOTIFY, OP_GETADDRINFO, OP_EP, OP_RSOCKET,
	OP_RBIND, OP_RLISTEN, OP_RCONNECT, OP_RACCEPT, OP_RIO, OP_RSOCKOPT, OP_RPOLL, OP_RCLOSE,
	OP_SRQ, OP_ECE, OP_RNAMES, OP_RIOMAP, OP_COUNT
};

/* How often each call is drawn: the calls that make connections and events most. */
static const int weight[OP_COUNT] = {
	[OP_CREATE_CH] = 3, [OP_DESTROY_CH] = 1, [OP_CREATE_ID] = 5, [OP_DESTROY_ID] = 2,
	[OP_BIND] = 4, [OP_RESOLVE_ADDR] = 4, [OP_RESOLVE_ROUTE] = 3, [OP_LISTEN] = 3,
	[OP_CONNECT] = 4, [OP_GET_EVENT] = 7, [OP_ACK_EVENT] = 4, [OP_ACCEPT] = 3,
	[OP_REJECT] = 1, [OP_DISCONNECT] = 2, [OP_ALLOC_PD] = 2, [OP_CREATE_QP] = 3,
	[OP_DESTROY_QP] = 1, [OP_SET_OPTION] = 2, [OP_QUERY] = 2, [OP_MULTICAST] = 2,
	[OP_MIGRATE] = 1, [OP_NOTIFY] = 1, [OP_GETADDRINFO] = 2, [OP_EP] = 1, [OP_RSOCKET] = 3,
	[OP_RBIND] = 2, [OP_RLISTEN] = 2, [OP_RCONNECT] = 2, [OP_RACCEPT] = 2, [OP_RIO] = 4,
	[OP_RSOCKOPT] = 2, [OP_RPOLL] = 1, [OP_RCLOSE] = 1, [OP_SRQ] = 2, [OP_ECE] = 1,
	[OP_RNAMES] = 1, [OP_RIOMAP] = 2,
};

static const char *const op_name[OP_COUNT] = {
	"create_event_channel", "destroy_event_channel", "create_id", "destroy_id", "bind_addr",
	"resolve_addr", "resolve_route", "listen", "connect", "get_cm_event", "ack_cm_event",
	"accept", "reject", "disconnect", "alloc_pd (id's device)", "create_qp(_ex)", "destroy_qp",
	"set_option", "ports, init_qp_attr, event_str, devices", "join/leave_multicast",
	"migrate_id", "notify/establish", "getaddrinfo", "create_ep/destroy_ep", "rsocket", "rbind",
	"rlisten", "rconnect", "raccept", "rsend/rrecv/rread/rwrite/rsendmsg/rrecvmsg",
	"rsetsockopt/rgetsockopt", "rpoll", "rclose", "create_srq/destroy_srq",
	"set_local_ece/get_remote_ece/reject_ece",
	"rgetpeername/rgetsockname/rshutdown/rfcntl/rselect", "riomap/riowrite/riounmap",
};

/* ---- the objects a running program holds ---- */

/* Rsockets are descriptors, kept as fd + 1 in the pool (never a pointer C dereferences). */
enum kind { K_CH, K_ID, K_EV, K_PD, K_RS, K_COUNT };

#include "harness.h"

/* The ports the program's ids and rsockets meet on (one process, its own fabric). */
#define CM_PORT 39100
#define RS_PORT 39110

static int plain_fd = -1; /* a descriptor that is no rsocket */

/* Most programs start as a client and server in one process do: a channel, an id
 * listening, another resolving its address and route and connecting to it, the request read;
 * or an rsocket listening, another connecting to it, the connection accepted. */
static void shape(struct program *p, uint64_t seed)
{
	static const enum op cm[] = { OP_CREATE_CH,	OP_CREATE_ID,	  OP_BIND,
				      OP_LISTEN,	OP_CREATE_ID,	  OP_RESOLVE_ADDR,
				      OP_GET_EVENT,	OP_RESOLVE_ROUTE, OP_GET_EVENT,
				      OP_CREATE_QP,	OP_CONNECT,	  OP_GET_EVENT };
	static const enum op rs[] = { OP_RSOCKET, OP_RBIND,   OP_RLISTEN, OP_RSOCKET,
				      OP_RCONNECT, OP_RPOLL, OP_RACCEPT, OP_RACCEPT };
	const enum op *prologue = seed & 1 ? cm : rs;
	int np = seed & 1 ? (int)(sizeof cm / sizeof cm[0]) : (int)(sizeof rs / sizeof rs[0]);
	if (!(seed & 3))
		return;
	for (int i = 0; i < np && i < p->n; i++) {
		struct call *c = &p->calls[i];
		c->op = prologue[i];
		c->sane = 1;
		memset(c->r, 0, sizeof c->r);
		/* The second id or rsocket (slot 1: r >> 4 odd) resolves, makes its QP and
		 * connects. */
		if ((seed & 1 && i >= 5) || (!(seed & 1) && i == 4))
			c->r[0] = 16;
	}
}

/* ---- values ---- */

/* A socket address: mostly the loopback on one of three ports, else another family, an
 * address no port answers, the wildcard, NULL, or junk. */
static struct sockaddr *sockaddr_of(uint64_t r, uint16_t base, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof *ss);
	struct sockaddr_in *in = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
	uint16_t port = (uint16_t)(base + (r >> 8) % 3);
	if (!sane && (r >> 12) % 8 == 0)
		port = (uint16_t)(r >> 16);
	switch (sane ? 0 : r % 10) {
	case 0:
	case 1:
	case 2:
		in->sin_family = AF_INET;
		in->sin_port = htons(port);
		in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		break;
	case 3:
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons(port);
		in6->sin6_addr = in6addr_loopback;
		break;
	case 4:
		in->sin_family = AF_INET;
		in->sin_port = htons(port);
		in->sin_addr.s_addr = htonl(0xc0000201); /* 192.0.2.1: nobody's */
		break;
	case 5:
		in->sin_family = AF_INET;
		in->sin_port = htons(port);
		break;
	case 6:
		return NULL;
	case 7:
		ss->ss_family = AF_UNIX;
		memset((char *)ss + 2, 0x5a, 40);
		break;
	default:
		memset(ss, (int)(r >> 24), sizeof *ss);
		ss->ss_family = (sa_family_t)(r >> 32);
		break;
	}
	return (struct sockaddr *)ss;
}

static socklen_t addr_len(uint64_t r, const struct sockaddr *sa)
{
	socklen_t exact = sa && sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
							   : sizeof(struct sockaddr_in);
	if (sane)
		return exact;
	return (socklen_t)PICK(r, exact, exact, 0, 1, 8, sizeof(struct sockaddr_storage));
}

static int timeout_ms(uint64_t r)
{
	return sane ? 2000 : (int)PICK(r, 2000, 0, 1, -1, 0x7fffffff);
}

static enum rdma_port_space port_space(uint64_t r)
{
	if (sane)
		return r % 4 ? RDMA_PS_TCP : RDMA_PS_UDP;
	return (enum rdma_port_space)PICK(r, RDMA_PS_TCP, RDMA_PS_TCP, RDMA_PS_UDP, RDMA_PS_IB,
					  RDMA_PS_IPOIB, 0, 0x7fff, (uint64_t)-1);
}

/* Connection parameters, or NULL; private data from the program's buffer. */
static struct rdma_conn_param *conn_param(uint64_t r, struct rdma_conn_param *cp)
{
	if (!sane && r % 5 == 0)
		return NULL;
	memset(cp, 0, sizeof *cp);
	cp->private_data = r % 7 == 1 ? NULL : buf;
	cp->private_data_len =
		(uint8_t)(sane ? PICK(r >> 3, 0, 16) : PICK(r >> 3, 0, 16, 56, 57, 196, 255));
	cp->responder_resources = (uint8_t)(sane ? 1 : PICK(r >> 8, 0, 1, 16, 255));
	cp->initiator_depth = (uint8_t)(sane ? 1 : PICK(r >> 12, 0, 1, 16, 255));
	cp->retry_count = (uint8_t)(sane ? 7 : PICK(r >> 16, 0, 7, 255));
	cp->rnr_retry_count = (uint8_t)(sane ? 7 : PICK(r >> 20, 0, 7, 255));
	cp->flow_control = (uint8_t)(r >> 24);
	cp->srq = (uint8_t)(sane ? 0 : (r >> 32) & 1);
	cp->qp_num = sane ? 0 : (uint32_t)(r >> 40);
	return cp;
}

/* An rsocket descriptor: usually a live one, else hostile (*bad): closed, -1, one that is no
 * rsocket, or far out of range. */
static int rs_fd(uint64_t r, int *bad, const char **what)
{
	*bad = 1;
	switch (sane ? 7 : r % 12) {
	case 0:
		*what = "-1";
		return -1;
	case 1:
		for (int i = 0; i < SLOTS; i++) {
			struct obj *o = &pool[K_RS][(i + (r >> 8)) % SLOTS];
			if (o->p && !o->live && !is_live_anywhere(o->p)) {
				*what = "a closed rsocket";
				return (int)(intptr_t)o->p - 1;
			}
		}
		break;
	case 2:
		*what = "a descriptor that is no rsocket";
		return plain_fd;
	case 3:
		*what = "a descriptor out of range";
		return 1 << 20;
	}
	void *p = live(K_RS, r >> 4);
	*bad = p == NULL;
	*what = p ? "a live rsocket" : "-1 (none live)";
	return p ? (int)(intptr_t)p - 1 : -1;
}

static void add_rsocket(int fd)
{
	if (fd < 0)
		return;
	/* Nothing may block: connects, accepts and transfers all return at once. */
	rfcntl(fd, F_SETFL, rfcntl(fd, F_GETFL) | O_NONBLOCK);
	add(K_RS, (void *)(intptr_t)(fd + 1), -1);
}

/* ---- the calls ---- */

/* An id: usually live, else hostile (harness `handle`). */
#define ID(i) ((struct rdma_cm_id *)handle(K_ID, r[i], &bad, &what))

/* Whether an event the program holds still counts for `id` (a connection request counts for
 * its listener), only multicast ones if `multicast`: librdmacm's destroy, migration and
 * leave wait for those to be acknowledged, for ever in a program that holds them itself. */
static int holds_events_of(struct rdma_cm_id *id, int multicast)
{
	for (int i = 0; i < SLOTS; i++) {
		struct rdma_cm_event *ev = pool[K_EV][i].p;
		if (!pool[K_EV][i].live)
			continue;
		struct rdma_cm_id *owner =
			ev->event == RDMA_CM_EVENT_CONNECT_REQUEST ? ev->listen_id : ev->id;
		int mc = ev->event == RDMA_CM_EVENT_MULTICAST_JOIN ||
			 ev->event == RDMA_CM_EVENT_MULTICAST_ERROR;
		if (owner == id && (!multicast || mc))
			return 1;
	}
	return 0;
}

static void run_call(struct call *c)
{
	uint64_t *r = c->r;
	int bad = 0, bad2 = 0;
	const char *what = "", *what2 = "";
	current = op_name[c->op];
	sane = c->sane;
	LOG("%s%s\n", current, sane ? " (sane)" : "");
#define MUST_FAIL(ok)                                                   \
	do {                                                            \
		if ((ok) && (bad || bad2))                              \
			accepted(bad ? what : what2);                   \
	} while (0)
	struct sockaddr_storage ss, ss2;

	switch (c->op) {
	case OP_CREATE_CH: {
		struct rdma_event_channel *ch = rdma_create_event_channel();
		if (ch)
			fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
		add(K_CH, ch, -1);
		break;
	}
	case OP_DESTROY_CH: {
		/* librdmacm's channels outlive no id: only an idle one goes (a hostile one must
		 * not crash; the call returns nothing to check). */
		struct rdma_event_channel *ch = handle(K_CH, r[0], &bad, &what);
		int busy = 0;
		for (int i = 0; i < SLOTS; i++)
			busy |= pool[K_ID][i].live && pool[K_ID][i].ctx >= 0 &&
				pool[K_CH][pool[K_ID][i].ctx].p == ch && pool[K_CH][pool[K_ID][i].ctx].live;
		for (int i = 0; i < SLOTS; i++)
			busy |= pool[K_EV][i].live && pool[K_EV][i].ctx >= 0 &&
				pool[K_CH][pool[K_EV][i].ctx].p == ch;
		LOG("  %s%s\n", what, busy ? " (in use: kept)" : "");
		if (busy)
			break;
		rdma_destroy_event_channel(ch);
		kill_obj(K_CH, ch);
		break;
	}
	case OP_CREATE_ID: {
		struct rdma_event_channel *ch = handle(K_CH, r[0], &bad, &what);
		/* NULL is synchronous mode, whose calls wait for their event: not drawn. */
		if (!ch)
			break;
		struct rdma_cm_id *id = NULL;
		enum rdma_port_space ps = port_space(r[1]);
		int ret = rdma_create_id(ch, r[2] % 9 == 0 && !sane ? NULL : &id, NULL, ps);
		LOG("  %s, ps %#x = %d\n", what, ps, ret);
		MUST_FAIL(ret == 0);
		if (ret == 0 && id) {
			int slot = -1;
			for (int i = 0; i < SLOTS; i++)
				if (pool[K_CH][i].live && pool[K_CH][i].p == ch)
					slot = i;
			add(K_ID, id, slot);
		}
		break;
	}
	case OP_DESTROY_ID: {
		struct rdma_cm_id *id = ID(0);
		if (holds_events_of(id, 0))
			break;
		int ret = rdma_destroy_id(id);
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		if (ret == 0)
			kill_obj(K_ID, id);
		break;
	}
	case OP_BIND: {
		struct rdma_cm_id *id = ID(0);
		int ret = rdma_bind_addr(id, sockaddr_of(r[1], CM_PORT, &ss));
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_RESOLVE_ADDR: {
		struct rdma_cm_id *id = ID(0);
		struct sockaddr *src = r[1] % 3 ? NULL : sockaddr_of(r[1] >> 2, 0, &ss2);
		if (sane && src)
			((struct sockaddr_in *)src)->sin_port = 0;
		int ret = rdma_resolve_addr(id, src, sockaddr_of(r[2], CM_PORT, &ss),
					    timeout_ms(r[3]));
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_RESOLVE_ROUTE: {
		struct rdma_cm_id *id = ID(0);
		int ret = rdma_resolve_route(id, timeout_ms(r[1]));
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_LISTEN: {
		struct rdma_cm_id *id = ID(0);
		int backlog = sane ? 4 : (int)PICK(r[1], 4, 0, 1, -1, 0x7fffffff);
		int ret = rdma_listen(id, backlog);
		LOG("  %s, backlog %d = %d\n", what, backlog, ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_CONNECT:
	case OP_ACCEPT: {
		struct rdma_cm_id *id = ID(0);
		struct rdma_conn_param cp;
		struct rdma_conn_param *p = conn_param(r[1], &cp);
		int ret = c->op == OP_CONNECT ? rdma_connect(id, p) : rdma_accept(id, p);
		LOG("  %s, param %s = %d\n", what, p ? "given" : "NULL", ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_REJECT: {
		struct rdma_cm_id *id = ID(0);
		uint8_t len = (uint8_t)(sane ? 8 : PICK(r[1], 0, 8, 148, 255));
		int ret = rdma_reject(id, r[2] % 4 ? buf : NULL, len);
		LOG("  %s, %u bytes = %d\n", what, len, ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_DISCONNECT: {
		struct rdma_cm_id *id = ID(0);
		int ret = rdma_disconnect(id);
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_GET_EVENT: {
		struct rdma_event_channel *ch = handle(K_CH, r[0], &bad, &what);
		struct rdma_cm_event *ev = NULL;
		int ret = rdma_get_cm_event(ch, !sane && r[1] % 9 == 0 ? NULL : &ev);
		LOG("  %s = %d (%s)\n", what, ret, ret == 0 && ev ? rdma_event_str(ev->event) : "-");
		MUST_FAIL(ret == 0);
		if (ret || !ev)
			break;
		int ch_slot = -1;
		for (int i = 0; i < SLOTS; i++)
			if (pool[K_CH][i].live && pool[K_CH][i].p == ch)
				ch_slot = i;
		/* A request brings a new id, the application's to accept, reject or destroy. */
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST)
			add(K_ID, ev->id, ch_slot);
		if (add(K_EV, ev, ch_slot) < 0)
			rdma_ack_cm_event(ev); /* no room to keep it */
		break;
	}
	case OP_ACK_EVENT: {
		struct rdma_cm_event *ev = handle(K_EV, r[0], &bad, &what);
		int ret = rdma_ack_cm_event(ev);
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		if (ret == 0)
			kill_obj(K_EV, ev);
		break;
	}
	case OP_ALLOC_PD: {
		struct rdma_cm_id *id = live(K_ID, r[0]);
		if (!id || !id->verbs)
			break;
		add(K_PD, ibv_alloc_pd(id->verbs), -1);
		break;
	}
	case OP_CREATE_QP: {
		struct rdma_cm_id *id = ID(0);
		/* NULL is the id's own PD: not hostile. */
		struct ibv_pd *pd = r[1] % 3 ? NULL : handle(K_PD, r[2], &bad2, &what2);
		if (!pd)
			bad2 = 0;
		struct ibv_qp_init_attr qa = {
			.qp_type = sane ? (r[3] % 4 ? IBV_QPT_RC : IBV_QPT_UD)
					: (enum ibv_qp_type)PICK(r[3], IBV_QPT_RC, IBV_QPT_UD,
								 IBV_QPT_UC, 0, 77),
			.cap = { .max_send_wr = (uint32_t)counts(r[4]),
				 .max_recv_wr = (uint32_t)counts(r[5]),
				 .max_send_sge = (uint32_t)PICK(r[6], 1, 2, 0, 64, 1000),
				 .max_recv_sge = (uint32_t)PICK(r[7], 1, 2, 0, 64, 1000),
				 .max_inline_data = (uint32_t)PICK(r[6] >> 8, 0, 64, 1 << 20) },
			.sq_sig_all = (int)(r[7] >> 8) & 1,
		};
		int ret;
		if (r[0] % 4 == 3) {
			/* The extended attributes: a PD only with its mask bit. */
			struct ibv_qp_init_attr_ex ax = { .qp_type = qa.qp_type, .cap = qa.cap,
							  .sq_sig_all = qa.sq_sig_all, .pd = pd };
			ax.comp_mask = (uint32_t)PICK(r[7] >> 16, IBV_QP_INIT_ATTR_PD, 0, 0xffff);
			if (!(ax.comp_mask & IBV_QP_INIT_ATTR_PD))
				bad2 = 0;
			ret = rdma_create_qp_ex(id, r[1] % 11 ? &ax : NULL);
		} else {
			ret = rdma_create_qp(id, pd, &qa);
		}
		LOG("  %s, pd %s = %d\n", what, pd ? what2 : "NULL", ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_DESTROY_QP: {
		/* librdmacm's destroys id->qp unchecked: for an id with a QP only. */
		struct rdma_cm_id *id = live(K_ID, r[0]);
		if (id && id->qp)
			rdma_destroy_qp(id);
		break;
	}
	case OP_SET_OPTION: {
		struct rdma_cm_id *id = ID(0);
		int level = (int)PICK(r[1], RDMA_OPTION_ID, RDMA_OPTION_IB, 7, -1);
		int name = (int)PICK(r[2], RDMA_OPTION_ID_TOS, RDMA_OPTION_ID_REUSEADDR,
				     RDMA_OPTION_ID_AFONLY, RDMA_OPTION_ID_ACK_TIMEOUT,
				     RDMA_OPTION_IB_PATH, 99);
		size_t len = (size_t)PICK(r[3], 1, 4, 0, 2, 64, 72, 144, 4096);
		memset(buf, (int)(r[4] & 0xff), len);
		int ret = rdma_set_option(id, level, name, r[5] % 6 ? buf : NULL, len);
		LOG("  %s, level %d, option %d, %zu bytes = %d\n", what, level, name, len, ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_QUERY: {
		struct rdma_cm_id *id = ID(0);
		uint16_t sport = ntohs(rdma_get_src_port(id)), dport = ntohs(rdma_get_dst_port(id));
		struct ibv_qp_attr qa;
		int mask = 0;
		enum ibv_qp_state st = (enum ibv_qp_state)PICK(r[1], IBV_QPS_INIT, IBV_QPS_RTR,
							       IBV_QPS_RTS, IBV_QPS_RESET, 99);
		qa.qp_state = st;
		int ret = rdma_init_qp_attr(id, r[2] % 7 ? &qa : NULL, r[3] % 7 ? &mask : NULL);
		LOG("  %s: ports %u, %u; init_qp_attr(%d) = %d\n", what, sport, dport, st, ret);
		MUST_FAIL(ret == 0);
		LOG("  event_str = %s\n", rdma_event_str((enum rdma_cm_event_type)(r[4] % 40 - 3)));
		int n = -1;
		struct ibv_context **list = rdma_get_devices(r[5] % 3 ? &n : NULL);
		LOG("  get_devices: %d\n", n);
		rdma_free_devices(list);
		break;
	}
	case OP_MULTICAST: {
		struct rdma_cm_id *id = ID(0);
		struct sockaddr_storage group;
		struct sockaddr *sa = sockaddr_of(r[1], CM_PORT, &group);
		if (sa && sa->sa_family == AF_INET && (sane || r[2] % 3))
			((struct sockaddr_in *)sa)->sin_addr.s_addr = htonl(0xe0010101 + r[3] % 2);
		struct rdma_cm_join_mc_attr_ex mx = {
			.comp_mask = (uint32_t)PICK(r[5], RDMA_CM_JOIN_MC_ATTR_ADDRESS |
							      RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
						    RDMA_CM_JOIN_MC_ATTR_ADDRESS, 0, 0xff),
			.join_flags = (uint32_t)PICK(r[6], RDMA_MC_JOIN_FLAG_FULLMEMBER,
						     RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, 77),
			.addr = sa,
		};
		int ret;
		switch (r[4] % 4) {
		case 0:
			if (holds_events_of(id, 1))
				return;
			ret = rdma_leave_multicast(id, sa);
			break;
		case 1: ret = rdma_join_multicast_ex(id, r[7] % 7 ? &mx : NULL, NULL); break;
		default: ret = rdma_join_multicast(id, sa, NULL); break;
		}
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_MIGRATE: {
		struct rdma_cm_id *id = ID(0);
		struct rdma_event_channel *ch = handle(K_CH, r[1], &bad2, &what2);
		/* NULL makes the id synchronous, whose calls wait: not drawn. */
		if (!ch)
			break;
		if (holds_events_of(id, 0))
			return;
		int ret = rdma_migrate_id(id, ch);
		LOG("  %s to %s = %d\n", what, what2, ret);
		MUST_FAIL(ret == 0);
		if (ret == 0)
			for (int i = 0; i < SLOTS; i++)
				if (pool[K_ID][i].live && pool[K_ID][i].p == id)
					for (int j = 0; j < SLOTS; j++)
						if (pool[K_CH][j].live && pool[K_CH][j].p == ch)
							pool[K_ID][i].ctx = j;
		break;
	}
	case OP_NOTIFY: {
		struct rdma_cm_id *id = ID(0);
		int ret = r[2] % 3 ? rdma_notify(id, (enum ibv_event_type)PICK(r[1], IBV_EVENT_COMM_EST,
									     IBV_EVENT_QP_FATAL, 99))
				   : rdma_establish(id);
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_GETADDRINFO: {
		struct rdma_addrinfo hints = { 0 }, *res = NULL;
		hints.ai_flags = (int)PICK(r[0], 0, RAI_PASSIVE, RAI_NUMERICHOST, RAI_FAMILY, 0x7f);
		hints.ai_family = (int)PICK(r[1], 0, AF_INET, AF_INET6, AF_IB, 77);
		hints.ai_port_space = (int)PICK(r[2], RDMA_PS_TCP, RDMA_PS_UDP, RDMA_PS_IB, 0, 5);
		hints.ai_qp_type = (int)PICK(r[3], IBV_QPT_RC, IBV_QPT_UD, 0, 99);
		const char *node = (const char *)PICK(r[4], (uintptr_t) "127.0.0.1", 0,
						      (uintptr_t) "::1", (uintptr_t) "no.such.host.invalid",
						      (uintptr_t) "");
		const char *service = (const char *)PICK(r[5], (uintptr_t) "39100", 0,
							 (uintptr_t) "-1", (uintptr_t) "http");
		int ret = rdma_getaddrinfo(node, service, r[6] % 5 ? &hints : NULL,
					   r[7] % 9 ? &res : NULL);
		LOG("  %s:%s = %d\n", node ? node : "NULL", service ? service : "NULL", ret);
		if (ret == 0 && res)
			rdma_freeaddrinfo(res);
		break;
	}
	case OP_EP: {
		/* A synchronous id made from an address and let go at once (its calls wait). */
		struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res = NULL;
		if (r[0] % 2)
			hints.ai_flags = RAI_PASSIVE;
		if (rdma_getaddrinfo("127.0.0.1", "39101", &hints, &res))
			break;
		struct rdma_cm_id *id = NULL;
		struct ibv_qp_init_attr qa = { .cap = { 4, 4, 1, 1, 0 }, .qp_type = IBV_QPT_RC };
		struct ibv_pd *pd = r[1] % 3 ? NULL : handle(K_PD, r[2], &bad, &what);
		/* NULL is the device's PD; a PD kept for later (a passive id's, or with no QP
		 * made) is judged where it is used, as librdmacm judges it. */
		int makes_qp = r[3] % 2 && !(r[0] % 2);
		if (!pd || !makes_qp)
			bad = 0;
		int ret = rdma_create_ep(&id, res, pd, r[3] % 2 ? &qa : NULL);
		LOG("  pd %s = %d\n", pd ? what : "NULL", ret);
		MUST_FAIL(ret == 0);
		rdma_freeaddrinfo(res);
		if (ret == 0)
			rdma_destroy_ep(id);
		break;
	}
	case OP_RSOCKET: {
		int domain = sane ? AF_INET : (int)PICK(r[0], AF_INET, AF_INET6, AF_IB, AF_UNIX, -1);
		int type = sane ? SOCK_STREAM
				: (int)PICK(r[1], SOCK_STREAM, SOCK_DGRAM, SOCK_RAW, 99);
		int fd = rsocket(domain, type, 0);
		LOG("  domain %d, type %d = %d\n", domain, type, fd);
		add_rsocket(fd);
		break;
	}
	case OP_RBIND:
	case OP_RCONNECT: {
		int fd = rs_fd(r[0], &bad, &what);
		struct sockaddr *sa = sockaddr_of(r[1], RS_PORT, &ss);
		socklen_t len = addr_len(r[2], sa);
		int ret = c->op == OP_RBIND ? rbind(fd, sa, len) : rconnect(fd, sa, len);
		LOG("  %s, %u bytes = %d (%d)\n", what, len, ret, ret ? errno : 0);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_RLISTEN: {
		int fd = rs_fd(r[0], &bad, &what);
		int ret = rlisten(fd, sane ? 4 : (int)PICK(r[1], 4, 0, -1, 0x7fffffff));
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_RACCEPT: {
		int fd = rs_fd(r[0], &bad, &what);
		socklen_t len = (socklen_t)PICK(r[1], sizeof ss, 0, 4);
		int got = raccept(fd, r[2] % 3 ? (struct sockaddr *)&ss : NULL,
				  r[2] % 3 ? &len : NULL);
		LOG("  %s = %d\n", what, got);
		MUST_FAIL(got >= 0);
		add_rsocket(got);
		break;
	}
	case OP_RIO: {
		int fd = rs_fd(r[0], &bad, &what);
		size_t len = (size_t)PICK(r[1], 0, 1, 64, 4096, BUF_LEN / 2);
		ssize_t ret;
		struct iovec iov[2] = { { buf, len / 2 }, { buf + len / 2, len - len / 2 } };
		struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t)PICK(r[3], 2, 1, 0),
				     .msg_control = r[4] % 5 ? NULL : buf, .msg_controllen = 16 };
		switch (r[2] % 10) {
		case 8: ret = rsendmsg(fd, &mh, MSG_DONTWAIT); break;
		case 9: ret = rrecvmsg(fd, &mh, MSG_DONTWAIT); break;
		case 0: ret = rsend(fd, buf, len, MSG_DONTWAIT); break;
		case 1: ret = rrecv(fd, buf, len, MSG_DONTWAIT); break;
		case 2: ret = rwrite(fd, buf, len); break;
		case 3: ret = rread(fd, buf, len); break;
		case 4: ret = rwritev(fd, iov, 2); break;
		case 5: ret = rreadv(fd, iov, (int)PICK(r[3], 2, 0, -1)); break;
		case 6: {
			struct sockaddr *to = sockaddr_of(r[3], RS_PORT, &ss);
			ret = rsendto(fd, buf, len, MSG_DONTWAIT, to, addr_len(r[4], to));
			break;
		}
		default: {
			socklen_t alen = sizeof ss;
			ret = rrecvfrom(fd, buf, len, MSG_DONTWAIT, (struct sockaddr *)&ss, &alen);
			break;
		}
		}
		LOG("  %s, %zu bytes, kind %d = %zd (%d)\n", what, len, (int)(r[2] % 10), ret,
		    ret < 0 ? errno : 0);
		/* Zero bytes may succeed with nothing to check; more from a hostile rsocket not. */
		MUST_FAIL(ret > 0);
		break;
	}
	case OP_RSOCKOPT: {
		int fd = rs_fd(r[0], &bad, &what);
		int level = (int)PICK(r[1], SOL_SOCKET, IPPROTO_TCP, SOL_RDMA, IPPROTO_IPV6, 77);
		int name = (int)PICK(r[2], SO_REUSEADDR, SO_SNDBUF, SO_RCVBUF, SO_LINGER, SO_KEEPALIVE,
				     SO_ERROR, TCP_NODELAY, TCP_MAXSEG, IPV6_V6ONLY, RDMA_SQSIZE,
				     RDMA_RQSIZE, RDMA_INLINE, RDMA_IOMAPSIZE, RDMA_ROUTE, 999);
		socklen_t len = (socklen_t)PICK(r[3], 4, 0, 1, 8, 64, 1024);
		memset(buf, (int)(r[4] & 0xff), len);
		int ret;
		if (r[5] % 2) {
			ret = rsetsockopt(fd, level, name, r[6] % 7 ? buf : NULL, len);
		} else {
			socklen_t *lenp = r[6] % 7 ? &len : NULL;
			ret = rgetsockopt(fd, level, name, r[7] % 7 ? buf : NULL, lenp);
		}
		LOG("  %s, level %d, option %d = %d\n", what, level, name, ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_RPOLL: {
		struct pollfd fds[4];
		int n = (int)(r[0] % 5), any_bad = 0;
		for (int i = 0; i < n; i++) {
			fds[i].fd = rs_fd(r[1 + i], &bad2, &what2);
			fds[i].events = (short)PICK(r[5] >> (4 * i), POLLIN, POLLOUT, POLLIN | POLLOUT, 0);
			fds[i].revents = 0;
			any_bad |= bad2;
		}
		bad2 = 0;
		int ret = rpoll(n ? fds : NULL, (nfds_t)n, 0);
		LOG("  %d descriptors%s = %d\n", n, any_bad ? " (some hostile)" : "", ret);
		break;
	}
	case OP_RCLOSE: {
		int fd = rs_fd(r[0], &bad, &what);
		int ret = rclose(fd);
		LOG("  %s = %d\n", what, ret);
		MUST_FAIL(ret == 0);
		if (ret == 0)
			kill_obj(K_RS, (void *)(intptr_t)(fd + 1));
		break;
	}
	case OP_SRQ: {
		struct rdma_cm_id *id = ID(0);
		if (r[1] % 3 == 0) {
			/* librdmacm's destroys id->srq unchecked: for an id with an SRQ only. */
			struct rdma_cm_id *l = live(K_ID, r[0]);
			if (l && l->srq && !l->qp)
				rdma_destroy_srq(l);
			break;
		}
		struct ibv_pd *pd = r[2] % 3 ? NULL : handle(K_PD, r[3], &bad2, &what2);
		if (!pd)
			bad2 = 0;
		struct ibv_srq_init_attr sa = { .attr = { .max_wr = (uint32_t)counts(r[4]),
							  .max_sge = (uint32_t)PICK(r[5], 1, 0, 64, 1000) } };
		int ret = rdma_create_srq(id, pd, r[6] % 7 ? &sa : NULL);
		LOG("  %s, pd %s = %d\n", what, pd ? what2 : "NULL", ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_ECE: {
		struct rdma_cm_id *id = ID(0);
		struct ibv_ece ece = { .vendor_id = (uint32_t)r[1], .options = (uint32_t)(r[1] >> 32) };
		struct ibv_ece *e = r[2] % 5 ? &ece : NULL;
		int ret;
		switch (r[3] % 3) {
		case 0: ret = rdma_set_local_ece(id, e); break;
		case 1: ret = rdma_get_remote_ece(id, e); break;
		default: ret = rdma_reject_ece(id, buf, (uint8_t)PICK(r[4], 0, 8, 255)); break;
		}
		LOG("  %s, kind %d = %d\n", what, (int)(r[3] % 3), ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_RNAMES: {
		int fd = rs_fd(r[0], &bad, &what);
		socklen_t len = (socklen_t)PICK(r[1], sizeof ss, 0, 4, 16);
		int ret;
		switch (r[2] % 5) {
		case 3: {
			int cmd = (int)PICK(r[3], F_GETFL, F_SETFL, F_GETFD, 9999);
			ret = rfcntl(fd, cmd, (int)PICK(r[4], O_NONBLOCK, 0, -1));
			if (ret >= 0 && cmd != F_SETFL)
				ret = 0;
			/* A descriptor given back blocking would block the program. */
			if (!bad)
				rfcntl(fd, F_SETFL, rfcntl(fd, F_GETFL) | O_NONBLOCK);
			break;
		}
		case 4: {
			fd_set rd, wr;
			FD_ZERO(&rd);
			FD_ZERO(&wr);
			int n = fd >= 0 && fd < FD_SETSIZE ? fd + 1 : 0;
			if (n) {
				FD_SET(fd, &rd);
				FD_SET(fd, &wr);
			}
			struct timeval tv = { 0, 0 };
			ret = rselect(n, &rd, r[3] % 2 ? &wr : NULL, NULL, &tv);
			ret = ret < 0 ? ret : 0;
			bad = 0; /* a descriptor select does not know is not an error it reports */
			break;
		}
		case 0:
			ret = rgetpeername(fd, r[3] % 5 ? (struct sockaddr *)&ss : NULL,
					   r[4] % 5 ? &len : NULL);
			break;
		case 1:
			ret = rgetsockname(fd, r[3] % 5 ? (struct sockaddr *)&ss : NULL,
					   r[4] % 5 ? &len : NULL);
			break;
		default:
			ret = rshutdown(fd, (int)PICK(r[3], SHUT_RD, SHUT_WR, SHUT_RDWR, 7));
			break;
		}
		LOG("  %s, kind %d = %d\n", what, (int)(r[2] % 5), ret);
		MUST_FAIL(ret == 0);
		break;
	}
	case OP_RIOMAP: {
		int fd = rs_fd(r[0], &bad, &what);
		size_t len = (size_t)PICK(r[1], 4096, 0, 1, BUF_LEN / 2);
		char *at = buf + BUF_LEN / 2 + (r[2] % 2) * 4096;
		off_t ret;
		switch (r[3] % 3) {
		case 0:
			ret = riomap(fd, at, len, (int)PICK(r[4], PROT_WRITE, PROT_READ, 0, 77),
				     (int)PICK(r[5], 0, 1, 99), r[6] % 2 ? -1 : (off_t)(r[6] >> 40));
			MUST_FAIL(ret != -1);
			break;
		case 1:
			ret = (off_t)riowrite(fd, buf, len, (off_t)PICK(r[4], 0, 4096, -1),
					      (int)PICK(r[5], 0, MSG_DONTWAIT));
			MUST_FAIL(ret > 0 && (size_t)ret != (size_t)-1);
			break;
		default:
			ret = riounmap(fd, at, len);
			MUST_FAIL(ret == 0);
			break;
		}
		LOG("  %s, %zu bytes, kind %d = %lld\n", what, len, (int)(r[3] % 3), (long long)ret);
		break;
	}
	case OP_COUNT:
		break;
	}
}

static void setup(void)
{
	plain_fd = eventfd(0, EFD_NONBLOCK);
}

/* Acknowledges the events kept, then destroys what is left, ids before their channels, as an
 * application must. */
static void teardown(void)
{
	current = "the end: ack, destroy, close";
	for (int i = 0; i < SLOTS; i++)
		if (pool[K_EV][i].live && rdma_ack_cm_event(pool[K_EV][i].p))
			_exit(4);
	for (int i = 0; i < SLOTS; i++)
		if (pool[K_RS][i].live && rclose((int)(intptr_t)pool[K_RS][i].p - 1))
			_exit(4);
	for (int i = 0; i < SLOTS; i++)
		if (pool[K_ID][i].live) {
			struct rdma_cm_id *id = pool[K_ID][i].p;
			if (id->qp)
				rdma_destroy_qp(id);
			if (rdma_destroy_id(id))
				_exit(4);
		}
	for (int i = 0; i < SLOTS; i++)
		if (pool[K_PD][i].live)
			ibv_dealloc_pd(pool[K_PD][i].p);
	for (int i = 0; i < SLOTS; i++)
		if (pool[K_CH][i].live)
			rdma_destroy_event_channel(pool[K_CH][i].p);
	close(plain_fd);
}

static int self_test_crashes(const struct call *c)
{
	return c->op == OP_GET_EVENT;
}
