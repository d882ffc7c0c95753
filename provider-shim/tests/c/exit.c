/* A process that exits (exit(), or a return from main) with a QP still connected to another
 * process's leaves that peer as hardware does when the kernel destroys an exiting process's
 * QPs: the peer's QP stays in RTS with its receive posted and no event, and a SEND it posts
 * runs out of retries (RETRY_EXC_ERR, then its receive flushes). One that dies without
 * exiting (_exit here, as a kill) fails the peer's QP at once: its receive flushes, and the
 * full profile raises QP_FATAL. Prints "exit ok". */
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

/* What a side tells its peer to connect to it. */
struct addr {
	uint32_t qp_num;
	uint16_t lid;
	uint8_t link_layer;
	union ibv_gid gid;
};

static void tell(int fd, const struct side *s)
{
	struct addr a = { .qp_num = s->qp->qp_num, .lid = s->port.lid,
			  .link_layer = s->port.link_layer, .gid = s->gid };
	CHECK(write(fd, &a, sizeof(a)) == sizeof(a));
}

/* Connects `s` to the side whose address comes on `fd`. */
static void connect_to_told(struct side *s, int fd)
{
	struct addr a;
	struct ibv_qp qp = { 0 };
	struct side peer = { 0 };
	CHECK(read(fd, &a, sizeof(a)) == sizeof(a));
	qp.qp_num = a.qp_num;
	peer.qp = &qp;
	peer.port.lid = a.lid;
	peer.port.link_layer = a.link_layer;
	peer.gid = a.gid;
	connect_to(s, &peer);
}

static void post_recv(struct side *s, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf, .length = 64, .lkey = s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(s->qp, &wr, &bad) == 0);
}

static enum ibv_qp_state state(struct side *s)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	CHECK(ibv_query_qp(s->qp, &a, IBV_QP_STATE, &ia) == 0);
	return a.qp_state;
}

/* The next async event of `s`'s context, or -1 if none is queued. */
static int async_event(struct side *s)
{
	struct ibv_async_event ev;
	int flags = fcntl(s->ctx->async_fd, F_GETFL);
	CHECK(fcntl(s->ctx->async_fd, F_SETFL, flags | O_NONBLOCK) == 0);
	errno = 0;
	int got = ibv_get_async_event(s->ctx, &ev);
	CHECK(got == 0 || errno == EAGAIN);
	CHECK(fcntl(s->ctx->async_fd, F_SETFL, flags) == 0);
	if (got)
		return -1;
	ibv_ack_async_event(&ev);
	return ev.event_type;
}

/* A child connected to a QP of this process's, which exits (`die` 0) or dies (1) once both
 * are connected, its QP open. This process's QP, connected with a receive posted. */
static void peer_that_goes(struct ibv_device **list, struct side *a, int die)
{
	int to_child[2], to_parent[2];
	memset(a, 0, sizeof(*a));
	setup(a, list[0]);
	CHECK(pipe(to_child) == 0 && pipe(to_parent) == 0);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct side b = { 0 };
		char go;
		setup(&b, list[0]);
		tell(to_parent[1], &b);
		connect_to_told(&b, to_child[0]);
		post_recv(&b, 9);
		CHECK(read(to_child[0], &go, 1) == 1);
		if (die)
			_exit(0);
		exit(0);
	}
	connect_to_told(a, to_parent[0]);
	tell(to_child[1], a);
	post_recv(a, 1);
	CHECK(write(to_child[1], "g", 1) == 1);
	int status;
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
	close(to_child[0]);
	close(to_child[1]);
	close(to_parent[0]);
	close(to_parent[1]);
}

static void teardown(struct side *s)
{
	CHECK(ibv_destroy_qp(s->qp) == 0 && ibv_destroy_cq(s->cq) == 0);
	CHECK(ibv_dereg_mr(s->mr) == 0 && ibv_destroy_comp_channel(s->ch) == 0);
	CHECK(ibv_dealloc_pd(s->pd) == 0 && ibv_close_device(s->ctx) == 0);
	free(s->buf);
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0);
	const char *profile = getenv("RDMA_EMU_PROFILE");
	int full = !profile || strcmp(profile, "rxe") != 0;
	struct side a;

	/* Exited: nothing happens to the QP until it sends. */
	peer_that_goes(list, &a, 0);
	struct ibv_sge sge = { .addr = (uintptr_t)a.buf + 64, .length = 8, .lkey = a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;
	CHECK(ibv_post_send(a.qp, &wr, &bad) == 0);
	struct ibv_wc wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 2 && wc.status == IBV_WC_RETRY_EXC_ERR);
	wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 1 && wc.status == IBV_WC_WR_FLUSH_ERR);
	CHECK(state(&a) == IBV_QPS_ERR);
	CHECK(async_event(&a) == -1);
	teardown(&a);

	/* Died: the QP fails at once. */
	peer_that_goes(list, &a, 1);
	wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 1 && wc.status == IBV_WC_WR_FLUSH_ERR);
	CHECK(state(&a) == IBV_QPS_ERR);
	CHECK(async_event(&a) == (full ? IBV_EVENT_QP_FATAL : -1));
	teardown(&a);

	ibv_free_device_list(list);
	printf("exit ok\n");
	return 0;
}
