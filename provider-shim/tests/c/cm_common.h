/* Helpers shared by the connection manager's C tests. */
#ifndef RDMA_EMU_TEST_CM_COMMON_H
#define RDMA_EMU_TEST_CM_COMMON_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <unistd.h>

#include "common.h"

static inline struct sockaddr_in addr(const char *ip, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	CHECK(inet_pton(AF_INET, ip, &a.sin_addr) == 1);
	return a;
}

/* The next event, which must be `want`; a connection's end of time-wait (2 s after it ended)
 * may come in between, whenever the clock says, and is passed over. */
static inline struct rdma_cm_event *next(struct rdma_event_channel *ch,
					 enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev;
	CHECK(rdma_get_cm_event(ch, &ev) == 0);
	while (ev->event == RDMA_CM_EVENT_TIMEWAIT_EXIT && want != ev->event) {
		rdma_ack_cm_event(ev);
		CHECK(rdma_get_cm_event(ch, &ev) == 0);
	}
	if (ev->event != want) {
		fprintf(stderr, "got %s (status %d), want %s\n", rdma_event_str(ev->event), ev->status,
			rdma_event_str(want));
		exit(1);
	}
	return ev;
}

static inline void cm_call_hung(int sig)
{
	static const char m[] = "a connection manager call never returned\n";
	(void)sig;
	CHECK(write(2, m, sizeof m - 1) > 0);
	_exit(1);
}

/* A call that waits for ever (for an acknowledgement, an event never coming) fails the test
 * after `seconds` instead of hanging it. */
static inline void fail_if_hung(unsigned seconds)
{
	signal(SIGALRM, cm_call_hung);
	alarm(seconds);
}

#endif
