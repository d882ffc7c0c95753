/* Every connection manager call on an id in each state it can be in (RC, or UD with CM_STATES_UD
 * set, whose exchange is SIDR's and has no disconnection): for each (state, call)
 * a fresh id is brought to the state, the call made, and one line printed: its return and
 * errno, its QP's state after, what the id shows of its port, device, route and ports, and
 * the events each side heard then. The test compares the
 * lines with those recorded on the kernel's rxe (cm_states.rxe, made by this program in the
 * VM with CM_STATES_HOST its port's address and CM_STATES_WAIT_MS 100). Left out: three
 * calls that crash librdmacm 44 on an id with no address (the emulator answers EINVAL)
 * (docs/rdma-cm.md). What a client's id that withdrew its request answers next is not
 * recorded: on rxe (kernel 6.1) its rdma_accept never returned, and after four or five
 * withdrawals in a row destroying the ids hung (tests/cm.rs covers the emulator's). */
#define _GNU_SOURCE
#include <poll.h>
#include <rdma/rdma_cma.h>

#include "cm_common.h"

static struct rdma_event_channel *cch, *sch;
static struct sockaddr_in to, local;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static int wait_ms = 10, next_port = 7580, ud;
static enum rdma_port_space ps = RDMA_PS_TCP;

/* The next event on `ch` within `ms`, or NULL. */
static struct rdma_cm_event *within(struct rdma_event_channel *ch, int ms)
{
	struct pollfd p = { ch->fd, POLLIN, 0 };
	struct rdma_cm_event *ev;
	if (poll(&p, 1, ms) <= 0)
		return NULL;
	CHECK(rdma_get_cm_event(ch, &ev) == 0);
	return ev;
}

/* The next event on `ch`, which must be `want` (time-wait's end passed over). */
static void expect(struct rdma_event_channel *ch, enum rdma_cm_event_type want, struct rdma_cm_id **id)
{
	struct rdma_cm_event *ev;
	do {
		CHECK((ev = within(ch, 5000)));
		if (ev->event == RDMA_CM_EVENT_TIMEWAIT_EXIT)
			rdma_ack_cm_event(ev);
	} while (ev->event == RDMA_CM_EVENT_TIMEWAIT_EXIT);
	if (ev->event != want) {
		fprintf(stderr, "setting up: %s, want %s\n", rdma_event_str(ev->event), rdma_event_str(want));
		exit(1);
	}
	if (id)
		*id = ev->id;
	rdma_ack_cm_event(ev);
}

/* Requests heard while draining, rejected and destroyed after each case. */
static struct rdma_cm_id *stray[16];
static int nstray;

/* Appends the events `ch` brings within the wait to `out`, as " who:EVENT/status". */
static void heard(struct rdma_event_channel *ch, const char *who, int ms, char *out, size_t len)
{
	struct rdma_cm_event *ev;
	while ((ev = within(ch, ms))) {
		if (ev->event != RDMA_CM_EVENT_TIMEWAIT_EXIT)
			snprintf(out + strlen(out), len - strlen(out), " %s:%s/%d", who,
				 rdma_event_str(ev->event) + strlen("RDMA_CM_EVENT_"), ev->status);
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST && nstray < 16)
			stray[nstray++] = ev->id;
		rdma_ack_cm_event(ev);
	}
}

static struct ibv_qp_init_attr qp_attr(void)
{
	struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq,
				      .qp_type = ud ? IBV_QPT_UD : IBV_QPT_RC,
				      .cap = { .max_send_wr = 4, .max_recv_wr = 4,
					       .max_send_sge = 1, .max_recv_sge = 1 } };
	return a;
}

static struct rdma_conn_param param = { .responder_resources = 1, .initiator_depth = 1,
					.retry_count = 7, .rnr_retry_count = 7 };

enum state { CREATED, BOUND, ADDR, ROUTE, ROUTE_QP, CONNECTING, CONNECTED, DISC_SELF, DISC_PEER,
	     REJECTED, LISTENING, P_REQUEST, P_REQUEST_QP, P_REJECTED, P_ACCEPTED, P_DISC_PEER,
	     NSTATES };
static const char *state_name[] = { "created", "bound", "addr", "route", "route+qp", "connecting",
	"connected", "disc-self", "disc-peer", "rejected", "listening", "p-request", "p-request+qp",
	"p-rejected", "p-accepted", "p-disc-peer" };

enum call { BIND, RESOLVE_ADDR, RESOLVE_ROUTE, LISTEN, CONNECT, ACCEPT, REJECT, DISCONNECT,
	    NOTIFY, SET_TOS, CREATE_QP, ESTABLISH, INIT_QP_ATTR, NCALLS };
static const char *call_name[] = { "bind", "resolve_addr", "resolve_route", "listen", "connect",
	"accept", "reject", "disconnect", "notify", "set_tos", "create_qp", "establish",
	"init_qp_attr" };

static int left_out(enum state s, enum call k)
{
	if (ud && (s == DISC_SELF || s == DISC_PEER || s == P_DISC_PEER))
		return 1;
	return s == CREATED && (k == RESOLVE_ROUTE || k == CONNECT || k == ACCEPT);
}

static struct rdma_cm_id *with_route(int qp)
{
	struct rdma_cm_id *id;
	CHECK(rdma_create_id(cch, &id, NULL, ps) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&to, 2000) == 0);
	expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED, NULL);
	CHECK(rdma_resolve_route(id, 2000) == 0);
	expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL);
	if (qp) {
		struct ibv_qp_init_attr a = qp_attr();
		CHECK(rdma_create_qp(id, pd, &a) == 0);
	}
	return id;
}

/* An id in state `s` (`*other` the other end of its connection, if it has one). */
static struct rdma_cm_id *make(enum state s, struct rdma_cm_id **other)
{
	struct rdma_cm_id *id, *c, *p;
	struct ibv_qp_init_attr a = qp_attr();
	*other = NULL;
	if (s <= ADDR || s == LISTENING) {
		struct sockaddr_in l = local;
		CHECK(rdma_create_id(cch, &id, NULL, ps) == 0);
		if (s == BOUND)
			CHECK(rdma_bind_addr(id, (struct sockaddr *)&local) == 0);
		if (s == ADDR) {
			CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&to, 2000) == 0);
			expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED, NULL);
		}
		if (s == LISTENING) {
			l.sin_port = htons(next_port++);
			CHECK(rdma_bind_addr(id, (struct sockaddr *)&l) == 0);
			CHECK(rdma_listen(id, 4) == 0);
		}
		return id;
	}
	if (s == ROUTE || s == ROUTE_QP)
		return with_route(s == ROUTE_QP);
	c = with_route(1);
	CHECK(rdma_connect(c, &param) == 0);
	expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST, &p);
	*other = p;
	if (s == CONNECTING)
		return c;
	*other = c;
	if (s == P_REQUEST)
		return p;
	CHECK(rdma_create_qp(p, pd, &a) == 0);
	if (s == P_REQUEST_QP)
		return p;
	if (s == REJECTED || s == P_REJECTED) {
		CHECK(rdma_reject(p, NULL, 0) == 0);
		expect(cch, ud ? RDMA_CM_EVENT_UNREACHABLE : RDMA_CM_EVENT_REJECTED, NULL);
		*other = s == REJECTED ? p : c;
		return s == REJECTED ? c : p;
	}
	CHECK(rdma_accept(p, &param) == 0);
	expect(cch, RDMA_CM_EVENT_ESTABLISHED, NULL);
	if (!ud) /* (a SIDR reply has no RTU) */
		expect(sch, RDMA_CM_EVENT_ESTABLISHED, NULL);
	if (s == P_ACCEPTED)
		return p;
	*other = p;
	if (s == CONNECTED)
		return c;
	if (s == DISC_SELF) {
		CHECK(rdma_disconnect(c) == 0);
		expect(sch, RDMA_CM_EVENT_DISCONNECTED, NULL);
		CHECK(rdma_disconnect(p) == 0);
		expect(cch, RDMA_CM_EVENT_DISCONNECTED, NULL);
		return c;
	}
	if (s == DISC_PEER) {
		CHECK(rdma_disconnect(p) == 0);
		expect(cch, RDMA_CM_EVENT_DISCONNECTED, NULL);
		return c;
	}
	CHECK(rdma_disconnect(c) == 0); /* P_DISC_PEER */
	expect(sch, RDMA_CM_EVENT_DISCONNECTED, NULL);
	*other = c;
	return p;
}

/* Makes call `k` on `id`: its return (init_qp_attr's mask, as 1000 + mask, when it succeeds;
 * -2 for create_qp on an id that has a QP). */
static int call(enum call k, struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr a = qp_attr();
	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_INIT };
	int mask = 0, rc;
	uint8_t tos = 5;
	switch (k) {
	case BIND: return rdma_bind_addr(id, (struct sockaddr *)&local);
	case RESOLVE_ADDR: return rdma_resolve_addr(id, NULL, (struct sockaddr *)&to, 2000);
	case RESOLVE_ROUTE: return rdma_resolve_route(id, 2000);
	case LISTEN: return rdma_listen(id, 1);
	case CONNECT: return rdma_connect(id, &param);
	case ACCEPT: return rdma_accept(id, &param);
	case REJECT: return rdma_reject(id, NULL, 0);
	case DISCONNECT: return rdma_disconnect(id);
	case NOTIFY: return rdma_notify(id, IBV_EVENT_COMM_EST);
	case SET_TOS: return rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos);
	case CREATE_QP: return id->qp ? -2 : rdma_create_qp(id, pd, &a);
	case ESTABLISH: return rdma_establish(id);
	case INIT_QP_ATTR:
		rc = rdma_init_qp_attr(id, &qa, &mask);
		return rc ? rc : 1000 + mask;
	default: return -3;
	}
}

int main(void)
{
	const char *host = getenv("CM_STATES_HOST") ? getenv("CM_STATES_HOST") : "127.0.0.1";
	struct rdma_cm_id *listener;
	if (getenv("CM_STATES_WAIT_MS"))
		wait_ms = atoi(getenv("CM_STATES_WAIT_MS"));
	ud = getenv("CM_STATES_UD") != NULL;
	ps = ud ? RDMA_PS_UDP : RDMA_PS_TCP;
	setvbuf(stdout, NULL, _IONBF, 0);
	fail_if_hung(600);
	to = addr(host, 7480);
	local = addr(host, 0);
	CHECK((cch = rdma_create_event_channel()) && (sch = rdma_create_event_channel()));
	CHECK(rdma_create_id(sch, &listener, NULL, ps) == 0);
	CHECK(rdma_bind_addr(listener, (struct sockaddr *)&to) == 0);
	CHECK(rdma_listen(listener, 16) == 0);
	CHECK((pd = ibv_alloc_pd(listener->verbs)) && (cq = ibv_create_cq(listener->verbs, 64, NULL, NULL, 0)));
	for (int s = 0; s < NSTATES; s++) {
		for (int k = 0; k < NCALLS; k++) {
			struct rdma_cm_id *id, *other;
			struct ibv_qp_attr qa;
			struct ibv_qp_init_attr qi;
			char events[512] = "", late[512] = "";
			int rc, err, qp_state = -1;
			if (left_out(s, k))
				continue;
			id = make(s, &other);
			errno = 0;
			rc = call(k, id);
			err = rc == -1 ? errno : 0;
			heard(cch, "c", wait_ms, events, sizeof events);
			heard(sch, "s", wait_ms, events, sizeof events);
			if (id->qp && ibv_query_qp(id->qp, &qa, IBV_QP_STATE, &qi) == 0)
				qp_state = qa.qp_state;
			printf("%-12s %-13s rc %d errno %d qp %d port %d dev %d paths %d sport %d dport %d |%s\n",
			       state_name[s], call_name[k], rc, err, qp_state, id->port_num, id->verbs != NULL,
			       id->route.num_paths, rdma_get_src_port(id) != 0, rdma_get_dst_port(id) != 0,
			       events);
			/* The client first where it withdrew its request: the kernel's CM keeps
			 * resending a REQ its own reject left, which the listener takes as a new
			 * request once the first one's id is gone (an artefact of its MADs). */
			int client_first = s == CONNECTING && k == REJECT;
			for (int i = 0; i < 2; i++) {
				struct rdma_cm_id *x = (client_first ? !i : i) ? id : other;
				if (x && x->qp)
					rdma_destroy_qp(x);
				if (x)
					CHECK(rdma_destroy_id(x) == 0);
			}
			heard(cch, "c", wait_ms / 5, late, sizeof late);
			heard(sch, "s", wait_ms / 5, late, sizeof late);
			for (; nstray > 0; nstray--) {
				rdma_reject(stray[nstray - 1], NULL, 0);
				CHECK(rdma_destroy_id(stray[nstray - 1]) == 0);
			}
			if (late[0])
				printf("%-12s %-13s after destroy:%s\n", state_name[s], call_name[k], late);
		}
	}
	CHECK(ibv_destroy_cq(cq) == 0 && ibv_dealloc_pd(pd) == 0);
	CHECK(rdma_destroy_id(listener) == 0);
	printf("cm_states ok\n");
	return 0;
}
