/* ibv_close_device destroys everything the context owns, as the kernel does when a context's
 * command file closes: a peer's WRITE no longer lands in its memory, its handles are refused,
 * a pending unacknowledged event does not hang the close, and nothing (descriptors, threads)
 * is left behind however many times it is done. Prints "close ok". */
#include <dirent.h>
#include <pthread.h>

#include "common.h"

static int open_fds(void)
{
	int n = 0;
	DIR *d = opendir("/proc/self/fd");
	CHECK(d);
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

static void close_side(struct side *s)
{
	CHECK(ibv_close_device(s->ctx) == 0);
	free(s->buf);
}

/* A pair that talked, with an event handed out and never acknowledged, closed with every
 * object still alive. */
static void cycle(struct ibv_device **list)
{
	struct side a, b;
	struct ibv_send_wr wr = { .wr_id = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_recv_wr rwr = { .wr_id = 2 };
	struct ibv_send_wr *bad;
	struct ibv_recv_wr *rbad;
	struct ibv_sge sa = { 0 }, sb = { 0 };
	struct ibv_cq *ev_cq;
	void *ev_ctx;

	setup_pair(list, &a, &b);
	sb = (struct ibv_sge){ (uintptr_t)b.buf, 64, b.mr->lkey };
	rwr.sg_list = &sb;
	rwr.num_sge = 1;
	CHECK(ibv_post_recv(b.qp, &rwr, &rbad) == 0);
	CHECK(ibv_req_notify_cq(b.cq, 0) == 0);
	sa = (struct ibv_sge){ (uintptr_t)a.buf, 64, a.mr->lkey };
	wr.sg_list = &sa;
	wr.num_sge = 1;
	CHECK(ibv_post_send(a.qp, &wr, &bad) == 0);
	CHECK(wait_wc(a.cq).status == IBV_WC_SUCCESS);
	CHECK(ibv_get_cq_event(b.ch, &ev_cq, &ev_ctx) == 0 && ev_cq == b.cq);
	/* No ibv_ack_cq_events: ibv_destroy_cq would wait for it forever; closing must not. */
	close_side(&b);
	close_side(&a);
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct side a, b;
	struct ibv_send_wr wr = { .wr_id = 7, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;
	struct ibv_sge sge;
	struct ibv_qp_init_attr init = { .qp_type = IBV_QPT_RC, .cap = { 1, 1, 1, 1, 0 } };
	struct ibv_wc wc;
	uint32_t rkey;
	struct ibv_pd *stale_pd;
	struct ibv_cq *stale_cq;
	struct ibv_mr *stale_mr;
	char *target;
	int before;

	CHECK(list && n >= 2);
	/* Once around first: the process joins its fabric (threads, sockets) at the first open. */
	cycle(list);
	before = open_fds();
	for (int i = 0; i < 300; i++)
		cycle(list);
	CHECK(open_fds() == before);

	/* A peer's WRITE into the memory of a closed context does not land: the peer holds the
	 * address and rkey it was given before the close. */
	setup_pair(list, &a, &b);
	target = a.buf;
	memset(target, 0x11, BUF);
	rkey = a.mr->rkey;
	stale_pd = a.pd;
	stale_cq = a.cq;
	stale_mr = a.mr;
	CHECK(ibv_close_device(a.ctx) == 0);
	memcpy(b.buf, "must not land", 14);
	sge = (struct ibv_sge){ (uintptr_t)b.buf, 14, b.mr->lkey };
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.rdma.remote_addr = (uintptr_t)target;
	wr.wr.rdma.rkey = rkey;
	CHECK(ibv_post_send(b.qp, &wr, &bad) == 0);
	wc = wait_wc(b.cq);
	CHECK(wc.wr_id == 7 && wc.status == IBV_WC_RETRY_EXC_ERR);
	for (int i = 0; i < BUF; i++)
		CHECK(target[i] == 0x11);

	/* The closed context's handles are refused, not used. */
	errno = 0;
	CHECK(ibv_create_qp(stale_pd, &init) == NULL && errno == EINVAL);
	errno = 0;
	CHECK(ibv_reg_mr(stale_pd, b.buf, 64, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EINVAL);
	CHECK(ibv_dealloc_pd(stale_pd) == EINVAL);
	CHECK(ibv_destroy_cq(stale_cq) == EINVAL);
	CHECK(ibv_dereg_mr(stale_mr) == EINVAL);
	CHECK(ibv_close_device(a.ctx) == EINVAL);
	close_side(&b);
	free(target);
	ibv_free_device_list(list);
	printf("close ok\n");
	return 0;
}
