/* The C-ABI figures of the ratio benchmarks: an 8-byte RDMA WRITE message rate (post 1 + poll 1
 * through ibv_post_send / ibv_poll_cq, one thread) and a polled SEND ping-pong round trip
 * between two threads on cores 0 and 1. Run on the shim by `ratios`; prints
 * "mops <Mops/s>" and "rtt_us <microseconds>". Usage: cabi <rate iterations> <rtt iterations>
 * [<hop iterations>: then only the hops below, for callgrind, after the rate]
 * [<churn rounds>: then only the churn below, "churn_us <microseconds per round>"] */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DIE(msg) do { fprintf(stderr, "cabi: %s\n", msg); exit(1); } while (0)

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char buf[4096] __attribute__((aligned(64)));
	struct ibv_port_attr port;
	union ibv_gid gid;
};

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin(int cpu)
{
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(cpu, &s);
	pthread_setaffinity_np(pthread_self(), sizeof(s), &s);
}

static void setup(struct side *s, struct ibv_device *dev)
{
	struct ibv_qp_init_attr init = { .cap = { 256, 256, 1, 1, 0 }, .qp_type = IBV_QPT_RC };
	if (!(s->ctx = ibv_open_device(dev)) || ibv_query_port(s->ctx, 1, &s->port) ||
	    ibv_query_gid(s->ctx, 1, 0, &s->gid) || !(s->pd = ibv_alloc_pd(s->ctx)) ||
	    !(s->cq = ibv_create_cq(s->ctx, 4096, NULL, NULL, 0)))
		DIE("setup");
	s->mr = ibv_reg_mr(s->pd, s->buf, sizeof(s->buf),
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	init.send_cq = init.recv_cq = s->cq;
	if (!s->mr || !(s->qp = ibv_create_qp(s->pd, &init)))
		DIE("mr/qp");
}

static void connect_to(struct side *a, struct side *b)
{
	struct ibv_qp_attr at = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				  .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	if (ibv_modify_qp(a->qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		DIE("init");
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTR;
	at.path_mtu = IBV_MTU_1024;
	at.dest_qp_num = b->qp->qp_num;
	at.max_dest_rd_atomic = 1;
	at.min_rnr_timer = 12;
	at.ah_attr.port_num = 1;
	at.ah_attr.dlid = b->port.lid;
	if (b->port.link_layer == IBV_LINK_LAYER_ETHERNET) {
		at.ah_attr.is_global = 1;
		at.ah_attr.grh.dgid = b->gid;
	}
	if (ibv_modify_qp(a->qp, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		DIE("rtr");
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTS;
	at.timeout = 14;
	at.retry_cnt = 7;
	at.rnr_retry = 7;
	at.max_rd_atomic = 1;
	if (ibv_modify_qp(a->qp, &at, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		DIE("rts");
}

static void poll1(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		;
	if (n < 0 || wc.status != IBV_WC_SUCCESS)
		DIE("completion");
}

static void post_recv(struct side *s)
{
	struct ibv_sge sge = { (uintptr_t)s->buf + 64, 8, s->mr->lkey };
	struct ibv_recv_wr wr = { .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(s->qp, &wr, &bad))
		DIE("post_recv");
}

static void post_send(struct side *s)
{
	struct ibv_sge sge = { (uintptr_t)s->buf, 8, s->mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND }, *bad;
	if (ibv_post_send(s->qp, &wr, &bad))
		DIE("post_send");
}

static struct side A, B;
static long rtt_iters;
static pthread_barrier_t go;

static void *peer(void *arg)
{
	(void)arg;
	pin(1);
	for (int i = 0; i < 4; i++)
		post_recv(&B);
	pthread_barrier_wait(&go);
	for (long i = 0; i < rtt_iters; i++) {
		poll1(B.cq);
		post_recv(&B);
		post_send(&B);
	}
	return NULL;
}

/* n 8-byte WRITEs, each posted and polled one at a time. */
static inline void rate_loop(struct ibv_send_wr *wr, long n)
{
	struct ibv_send_wr *bad;
	for (long i = 0; i < n; i++) {
		if (ibv_post_send(A.qp, wr, &bad))
			DIE("post");
		poll1(A.cq);
	}
}

/* The timed rounds, out of line so that callgrind can count exactly their instructions:
 *   valgrind --tool=callgrind --toggle-collect=measured_loop cabi-bench N 0  (divide by N) */
__attribute__((noinline)) static void measured_loop(struct ibv_send_wr *wr, long n)
{
	rate_loop(wr, n);
}

/* One hop of the ping-pong in one thread (A's SEND into B's posted receive, B's completion
 * polled, a receive posted again), out of line for callgrind as measured_loop:
 *   valgrind --tool=callgrind --toggle-collect=measured_hop cabi-bench 0 0 N
 * (divide by N + 1000: the warm-up's hops are counted too) */
__attribute__((noinline)) static void measured_hop(long n)
{
	for (long i = 0; i < n; i++) {
		post_send(&A);
		poll1(B.cq);
		post_recv(&B);
	}
}

static volatile int churning;

/* Polls B's (empty) CQ for as long as the churn runs, as an application's progress thread. */
static void *poller(void *arg)
{
	struct ibv_wc wc;
	(void)arg;
	pin(1);
	while (churning)
		if (ibv_poll_cq(B.cq, 1, &wc) < 0)
			DIE("poll");
	return NULL;
}

/* n rounds of a CQ, an MR and an RC QP made and destroyed on A's context while another
 * thread polls: what connection churn costs a process that moves data meanwhile. */
static double churn(long n)
{
	struct ibv_qp_init_attr init = { .cap = { 16, 16, 1, 1, 0 }, .qp_type = IBV_QPT_RC };
	pthread_t th;
	churning = 1;
	pthread_create(&th, NULL, poller, NULL);
	double t = now();
	for (long i = 0; i < n; i++) {
		struct ibv_cq *cq = ibv_create_cq(A.ctx, 16, NULL, NULL, 0);
		struct ibv_mr *mr = ibv_reg_mr(A.pd, A.buf, sizeof(A.buf), IBV_ACCESS_LOCAL_WRITE);
		init.send_cq = init.recv_cq = cq;
		struct ibv_qp *qp = cq ? ibv_create_qp(A.pd, &init) : NULL;
		if (!qp || !mr || ibv_destroy_qp(qp) || ibv_dereg_mr(mr) || ibv_destroy_cq(cq))
			DIE("churn");
	}
	t = now() - t;
	churning = 0;
	pthread_join(th, NULL);
	return t * 1e6 / n;
}

int main(int argc, char **argv)
{
	long rate_iters = argc > 1 ? atol(argv[1]) : 1000000;
	rtt_iters = argc > 2 ? atol(argv[2]) : 100000;
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	if (!l || n < 2)
		DIE("need two devices");
	pin(0);
	setup(&A, l[0]);
	setup(&B, l[1]);
	connect_to(&A, &B);
	connect_to(&B, &A);

	struct ibv_sge sge = { (uintptr_t)A.buf, 8, A.mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED };
	wr.wr.rdma.remote_addr = (uintptr_t)B.buf;
	wr.wr.rdma.rkey = B.mr->rkey;
	rate_loop(&wr, 1000); /* first uses (queues, tables) are no per-WR cost */
	double t = now();
	measured_loop(&wr, rate_iters);
	printf("mops %.4f\n", rate_iters / (now() - t) / 1e6);

	long churn_rounds = argc > 4 ? atol(argv[4]) : 0;
	if (churn_rounds) {
		churn(churn_rounds / 10 + 1); /* first uses */
		printf("churn_us %.4f\n", churn(churn_rounds));
		return 0;
	}
	long hop_iters = argc > 3 ? atol(argv[3]) : 0;
	if (hop_iters) {
		post_recv(&B);
		measured_hop(1000);
		measured_hop(hop_iters);
		return 0;
	}

	pthread_t th;
	pthread_barrier_init(&go, NULL, 2);
	pthread_create(&th, NULL, peer, NULL);
	for (int i = 0; i < 4; i++)
		post_recv(&A);
	pthread_barrier_wait(&go);
	t = now();
	for (long i = 0; i < rtt_iters; i++) {
		post_send(&A);
		poll1(A.cq);
		post_recv(&A);
	}
	printf("rtt_us %.4f\n", (now() - t) * 1e6 / rtt_iters);
	pthread_join(th, NULL);
	return 0;
}
