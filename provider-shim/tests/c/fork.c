/* A process that opened a device forks children that use the verbs and the CM themselves, as
 * rdma-core's own tests do (their two sides are forked from the test runner, which listed and
 * opened the devices first): each child is a process of its own on the host fabric, and one
 * opens a device it listed before the fork. The children end with exit(), which leaves the
 * parent where it was: the parent then serves a third child's connection, a fourth's that
 * dies connected (a DISCONNECTED for the parent, which keeps its QP as it was), and a fifth's
 * that dies leaving a child of its own alive; last, a child posts to a QP of the parent's,
 * which reaches nobody. Then, with a listening rsocket of the parent's, a child connects to a
 * listener of its own in one thread: its own listen service accepts. */
#include "common.h"

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <rdma/rsocket.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#define MSG "over the fork"

/* Accepts one connection on `port` and checks the message its peer sends: the listening id
 * and the connection's. */
static void accept_and_check(const char *port, struct rdma_cm_id **listen_id,
			     struct rdma_cm_id **id)
{
	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP };
	struct rdma_addrinfo *res;
	struct ibv_qp_init_attr attr = { .cap = { .max_send_wr = 1, .max_recv_wr = 1,
						  .max_send_sge = 1, .max_recv_sge = 1 },
					 .sq_sig_all = 1 };
	struct ibv_wc wc;
	char buf[64] = { 0 };

	CHECK(rdma_getaddrinfo("127.0.0.1", port, &hints, &res) == 0);
	CHECK(rdma_create_ep(listen_id, res, NULL, &attr) == 0);
	CHECK(rdma_listen(*listen_id, 1) == 0);
	CHECK(rdma_get_request(*listen_id, id) == 0);
	struct ibv_mr *mr = rdma_reg_msgs(*id, buf, sizeof(buf));
	CHECK(mr);
	CHECK(rdma_post_recv(*id, NULL, buf, sizeof(buf), mr) == 0);
	CHECK(rdma_accept(*id, NULL) == 0);
	CHECK(rdma_get_recv_comp(*id, &wc) == 1 && wc.status == IBV_WC_SUCCESS);
	CHECK(strcmp(buf, MSG) == 0);
	rdma_dereg_mr(mr);
	rdma_freeaddrinfo(res);
}

/* Accepts one connection on `port`, checks the message its peer sends, and disconnects. */
static void serve(const char *port)
{
	struct rdma_cm_id *listen_id, *id;

	accept_and_check(port, &listen_id, &id);
	rdma_disconnect(id);
	rdma_destroy_ep(id);
	rdma_destroy_ep(listen_id);
}

/* Read to its end by the child a dying client leaves behind (see connect_and_send_then). */
static int orphan_pipe[2];

static void reap(pid_t pid);

/* What a client does around its message (see connect_and_send_then). */
enum then { DISCONNECT, DIE, FORK_AND_DIE, CHILD_POSTS_FIRST };

/* Connects to `port` and sends the message; then disconnects, or ends the process there with
 * its id and QP open (DIE), having first forked a child of its own that lives on (until
 * orphan_pipe's write ends are all closed) with the descriptors it inherited (FORK_AND_DIE).
 * CHILD_POSTS_FIRST: before the message, a child posts a SEND of its own on the connection's
 * QP, which it inherited and may not use (the verbs' rule for a child): nothing of it reaches
 * the server, whose one receive takes the message, and the message's SEND completes. (The
 * parent's QP and the rings under it are the parent's alone: a child writing there would
 * garble the parent's stream to its peer.) */
static void connect_and_send_then(const char *port, enum then then)
{
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP };
	struct rdma_addrinfo *res;
	struct ibv_qp_init_attr attr = { .cap = { .max_send_wr = 1, .max_recv_wr = 1,
						  .max_send_sge = 1, .max_recv_sge = 1 },
					 .sq_sig_all = 1 };
	struct rdma_cm_id *id;
	struct ibv_wc wc;
	char buf[64] = MSG;

	CHECK(rdma_getaddrinfo("127.0.0.1", port, &hints, &res) == 0);
	CHECK(rdma_create_ep(&id, res, NULL, &attr) == 0);
	struct ibv_mr *mr = rdma_reg_msgs(id, buf, sizeof(buf));
	CHECK(mr);
	/* The server may not listen yet: try again for a while. */
	int tries = 0;
	while (rdma_connect(id, NULL) != 0) {
		CHECK(++tries < 500);
		rdma_dereg_mr(mr);
		rdma_destroy_ep(id);
		usleep(10000);
		CHECK(rdma_create_ep(&id, res, NULL, &attr) == 0);
		CHECK(mr = rdma_reg_msgs(id, buf, sizeof(buf)));
	}
	if (then == CHILD_POSTS_FIRST) {
		pid_t pid = fork();
		CHECK(pid >= 0);
		if (pid == 0) {
			/* (Its own copy of the buffer.) */
			strcpy(buf, "the child's");
			rdma_post_send(id, NULL, buf, sizeof(buf), mr, 0);
			_exit(0);
		}
		reap(pid);
	}
	CHECK(rdma_post_send(id, NULL, buf, sizeof(buf), mr, 0) == 0);
	CHECK(rdma_get_send_comp(id, &wc) == 1 && wc.status == IBV_WC_SUCCESS);
	if (then == FORK_AND_DIE) {
		pid_t orphan = fork();
		CHECK(orphan >= 0);
		if (orphan == 0) {
			char c;
			close(orphan_pipe[1]);
			while (read(orphan_pipe[0], &c, 1) > 0)
				;
			_exit(0);
		}
	}
	if (then == DIE || then == FORK_AND_DIE)
		_exit(0);
	rdma_disconnect(id);
	rdma_dereg_mr(mr);
	rdma_destroy_ep(id);
	rdma_freeaddrinfo(res);
}

static void connect_and_send(const char *port)
{
	connect_and_send_then(port, DISCONNECT);
}

/* Connects to `port`, sends the message and dies there, its id and QP open. */
static void connect_send_and_die(const char *port)
{
	connect_and_send_then(port, DIE);
}

/* The same, leaving a child of its own alive. */
static void connect_send_fork_and_die(const char *port)
{
	connect_and_send_then(port, FORK_AND_DIE);
}

/* Connects to `port`, and sends the message after a child posted to the QP. */
static void connect_and_send_after_a_childs_post(const char *port)
{
	connect_and_send_then(port, CHILD_POSTS_FIRST);
}

/* Accepts one connection on `port`, checks its message, and waits for the peer's process to
 * die: the CM reports DISCONNECTED, as the kernel's ends a dead process's connections (a DREQ),
 * and the QP is left to its owner, no async event raised on it. */
static void serve_until_the_peer_dies(const char *port)
{
	struct rdma_cm_id *listen_id, *id;
	struct rdma_cm_event *ev;
	struct ibv_async_event aev;
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;

	accept_and_check(port, &listen_id, &id);
	/* (A guard against a hang, not a measure: it comes at once.) */
	struct pollfd p = { .fd = id->channel->fd, .events = POLLIN };
	CHECK(poll(&p, 1, 20000) == 1);
	CHECK(rdma_get_cm_event(id->channel, &ev) == 0);
	CHECK(ev->event == RDMA_CM_EVENT_DISCONNECTED);
	rdma_ack_cm_event(ev);
	CHECK(ibv_query_qp(id->qp, &a, IBV_QP_STATE, &ia) == 0 && a.qp_state == IBV_QPS_RTS);
	int flags = fcntl(id->verbs->async_fd, F_GETFL);
	CHECK(fcntl(id->verbs->async_fd, F_SETFL, flags | O_NONBLOCK) == 0);
	errno = 0;
	CHECK(ibv_get_async_event(id->verbs, &aev) == -1 && errno == EAGAIN);
	CHECK(fcntl(id->verbs->async_fd, F_SETFL, flags) == 0);
	rdma_disconnect(id);
	CHECK(ibv_query_qp(id->qp, &a, IBV_QP_STATE, &ia) == 0 && a.qp_state == IBV_QPS_ERR);
	rdma_destroy_ep(id);
	rdma_destroy_ep(listen_id);
}

/* Runs `f(port)` in a child that ends with exit(); its pid. */
static pid_t child(void (*f)(const char *), const char *port, struct ibv_device *listed)
{
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid)
		return pid;
	if (listed) {
		/* A device the parent listed: the child's own device of that index. */
		struct ibv_context *ctx = ibv_open_device(listed);
		CHECK(ctx);
		struct ibv_pd *pd = ibv_alloc_pd(ctx);
		CHECK(pd);
		struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
		CHECK(cq);
		struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
					       .cap = { .max_send_wr = 1, .max_recv_wr = 1,
							.max_send_sge = 1, .max_recv_sge = 1 } };
		struct ibv_qp *qp = ibv_create_qp(pd, &qa);
		CHECK(qp);
		CHECK(ibv_destroy_qp(qp) == 0 && ibv_destroy_cq(cq) == 0);
		CHECK(ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0);
	}
	f(port);
	exit(0);
}

static void reap(pid_t pid)
{
	int status;
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0);
	/* The parent is a member of the host fabric before it forks. */
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx);

	pid_t server = child(serve, "7811", NULL);
	pid_t client = child(connect_and_send, "7811", list[0]);
	reap(client);
	reap(server);

	/* Both children exited (atexit handlers and all): the parent is still reachable. */
	pid_t third = child(connect_and_send, "7812", NULL);
	serve("7812");
	reap(third);

	/* A client whose process dies connected. */
	pid_t dies = child(connect_send_and_die, "7813", NULL);
	serve_until_the_peer_dies("7813");
	reap(dies);

	/* One whose process dies connected, leaving a child of its own alive: the child lets go
	 * of its copy of what says its parent lives, or the parent would live on for its peers
	 * (its connections never ended) while the child lived. */
	CHECK(pipe(orphan_pipe) == 0);
	dies = child(connect_send_fork_and_die, "7814", NULL);
	serve_until_the_peer_dies("7814");
	reap(dies);
	close(orphan_pipe[1]);
	close(orphan_pipe[0]);

	/* The parent's connection, which a child of its posts to. */
	pid_t served = child(serve, "7815", NULL);
	connect_and_send_after_a_childs_post("7815");
	reap(served);

	/* The parent's listener has the parent's listen service running; a child of it has no
	 * such thread, and starts its own as it listens. */
	struct sockaddr_in at = { .sin_family = AF_INET, .sin_port = htons(7816) };
	inet_pton(AF_INET, "127.0.0.1", &at.sin_addr);
	int pl = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(pl >= 0 && rbind(pl, (struct sockaddr *)&at, sizeof at) == 0 && rlisten(pl, 1) == 0);
	pid_t lone = fork();
	CHECK(lone >= 0);
	if (lone == 0) {
		char b = 0;
		alarm(30);
		at.sin_port = htons(7817);
		int l = rsocket(AF_INET, SOCK_STREAM, 0), c = rsocket(AF_INET, SOCK_STREAM, 0);
		CHECK(l >= 0 && c >= 0 && rbind(l, (struct sockaddr *)&at, sizeof at) == 0);
		CHECK(rlisten(l, 1) == 0 && rconnect(c, (struct sockaddr *)&at, sizeof at) == 0);
		CHECK(rsend(c, "x", 1, 0) == 1);
		int s = raccept(l, NULL, NULL);
		CHECK(s >= 0 && rrecv(s, &b, 1, MSG_WAITALL) == 1 && b == 'x');
		CHECK(rclose(s) == 0 && rclose(c) == 0 && rclose(l) == 0);
		exit(0);
	}
	reap(lone);
	CHECK(rclose(pl) == 0);

	CHECK(ibv_close_device(ctx) == 0);
	ibv_free_device_list(list);
	printf("fork ok\n");
	return 0;
}
