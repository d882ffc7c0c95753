/* librdmacm waits for acknowledgements: rdma_destroy_id, rdma_migrate_id and
 * rdma_leave_multicast return only once every event the application took for the id (or the
 * group) is acknowledged, so that an event's id stays valid as long as the event; a
 * connection request counts for its listener, not for the id it brings. Each wait is ended by
 * another thread's rdma_ack_cm_event. Run against the kernel's rxe too (CM_ACKS_HOST names
 * the address of its port; 127.0.0.1 otherwise). Prints "cm_acks ok". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <unistd.h>

#include "cm_common.h"

/* An event acknowledged by a thread of its own, a while after it starts; `acked` is set just
 * before the acknowledgement, and `context` read just before that from the id the event
 * counts for (a connection request's listener), which must still be there. */
struct later {
	pthread_t thread;
	struct rdma_cm_event *ev;
	void *context;
	int acked;
};

static void *ack_later(void *arg)
{
	struct later *l = arg;
	usleep(200 * 1000);
	l->context = (l->ev->listen_id ? l->ev->listen_id : l->ev->id)->context;
	__atomic_store_n(&l->acked, 1, __ATOMIC_SEQ_CST);
	CHECK(rdma_ack_cm_event(l->ev) == 0);
	return NULL;
}

static void start(struct later *l, struct rdma_cm_event *ev)
{
	memset(l, 0, sizeof *l);
	l->ev = ev;
	CHECK(pthread_create(&l->thread, NULL, ack_later, l) == 0);
}

/* The wait that just returned ended with the other thread's acknowledgement. */
static void ended_by(struct later *l, void *context)
{
	CHECK(__atomic_load_n(&l->acked, __ATOMIC_SEQ_CST) == 1);
	CHECK(pthread_join(l->thread, NULL) == 0);
	CHECK(l->context == context);
}

int main(void)
{
	const char *host = getenv("CM_ACKS_HOST") ? getenv("CM_ACKS_HOST") : "127.0.0.1";
	struct sockaddr_in there = addr(host, 7479), grp = addr("239.9.9.19", 0);
	struct rdma_event_channel *ch, *own;
	struct rdma_cm_id *listen, *id, *child;
	struct rdma_cm_event *ev;
	struct later l;
	int tag[4];

	fail_if_hung(30);
	CHECK(ch = rdma_create_event_channel());
	CHECK(own = rdma_create_event_channel());
	CHECK(rdma_create_id(ch, &listen, &tag[0], RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(listen, (struct sockaddr *)&there) == 0);
	CHECK(rdma_listen(listen, 4) == 0);

	/* rdma_destroy_id waits for the id's event another thread still holds. */
	CHECK(rdma_create_id(ch, &id, &tag[1], RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&there, 2000) == 0);
	start(&l, next(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK(rdma_destroy_id(id) == 0);
	ended_by(&l, &tag[1]);

	/* rdma_migrate_id waits too. */
	CHECK(rdma_create_id(ch, &id, &tag[2], RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&there, 2000) == 0);
	start(&l, next(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK(rdma_migrate_id(id, own) == 0);
	ended_by(&l, &tag[2]);
	CHECK(id->channel == own);

	/* A connection request counts for its listener: the new id is destroyed at once (its
	 * request not yet acknowledged), the listener waits for it. */
	CHECK(rdma_resolve_route(id, 2000) == 0);
	rdma_ack_cm_event(next(own, RDMA_CM_EVENT_ROUTE_RESOLVED));
	struct rdma_conn_param p = { .responder_resources = 1, .initiator_depth = 1,
				     .retry_count = 7, .rnr_retry_count = 7, .qp_num = 0x123 };
	CHECK(rdma_connect(id, &p) == 0);
	ev = next(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	CHECK(ev->listen_id == listen && ev->id != listen);
	child = ev->id;
	CHECK(rdma_reject(child, NULL, 0) == 0);
	CHECK(rdma_destroy_id(child) == 0);
	rdma_ack_cm_event(next(own, RDMA_CM_EVENT_REJECTED));
	CHECK(rdma_destroy_id(id) == 0);
	start(&l, ev);
	CHECK(rdma_destroy_id(listen) == 0);
	ended_by(&l, &tag[0]);

	/* rdma_leave_multicast waits for the group's events. */
	CHECK(rdma_create_id(ch, &id, &tag[3], RDMA_PS_UDP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&grp, 2000) == 0);
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK(rdma_join_multicast(id, (struct sockaddr *)&grp, NULL) == 0);
	start(&l, next(ch, RDMA_CM_EVENT_MULTICAST_JOIN));
	CHECK(rdma_leave_multicast(id, (struct sockaddr *)&grp) == 0);
	ended_by(&l, &tag[3]);
	CHECK(rdma_destroy_id(id) == 0);

	/* Nothing to wait for: every event acknowledged, or the one a synchronous id keeps
	 * (its destroy lets go of it). */
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&there, 2000) == 0);
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK(rdma_destroy_id(id) == 0);
	CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&there, 2000) == 0);
	CHECK(id->event && id->event->event == RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(rdma_destroy_id(id) == 0);

	rdma_destroy_event_channel(own);
	rdma_destroy_event_channel(ch);
	printf("cm_acks ok\n");
	return 0;
}
