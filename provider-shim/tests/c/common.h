/* Helpers shared by the C test programs: a connected RC pair on two emulated devices. */
#ifndef RDMA_EMU_TEST_COMMON_H
#define RDMA_EMU_TEST_COMMON_H

#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(c)                                                                        \
	do {                                                                            \
		if (!(c)) {                                                             \
			fprintf(stderr, "%s:%d: CHECK(%s) failed, errno %d (%s)\n", __FILE__, \
				__LINE__, #c, errno, strerror(errno));                  \
			exit(1);                                                        \
		}                                                                       \
	} while (0)

#define BUF 4096
#define ALL_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | \
		    IBV_ACCESS_REMOTE_ATOMIC)

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_cq_ex *cqx; /* set when the CQ was made with ibv_create_cq_ex */
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	struct ibv_port_attr port;
	union ibv_gid gid;
};

/* Opens the device and makes everything but the QP. */
static inline void setup_base(struct side *s, struct ibv_device *dev)
{
	CHECK(s->ctx = ibv_open_device(dev));
	CHECK(ibv_query_port(s->ctx, 1, &s->port) == 0);
	CHECK(s->port.state == IBV_PORT_ACTIVE);
	CHECK(ibv_query_gid(s->ctx, 1, 0, &s->gid) == 0);
	CHECK(s->pd = ibv_alloc_pd(s->ctx));
	CHECK(s->ch = ibv_create_comp_channel(s->ctx));
	CHECK(s->buf = aligned_alloc(4096, BUF));
	memset(s->buf, 0, BUF);
	CHECK(s->mr = ibv_reg_mr(s->pd, s->buf, BUF, ALL_ACCESS));
}

static inline void setup(struct side *s, struct ibv_device *dev)
{
	struct ibv_qp_init_attr init = {
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 2,
			 .max_inline_data = 64 },
		.qp_type = IBV_QPT_RC,
	};

	setup_base(s, dev);
	CHECK(s->cq = ibv_create_cq(s->ctx, 32, s, s->ch, 0));
	CHECK(s->cq->cqe >= 32);
	init.send_cq = init.recv_cq = s->cq;
	CHECK(s->qp = ibv_create_qp(s->pd, &init));
	CHECK(init.cap.max_send_wr >= 16 && init.cap.max_inline_data >= 64);
	CHECK(s->qp->state == IBV_QPS_RESET);
}

static inline void connect_to(struct side *a, struct side *b)
{
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1, .qp_access_flags = ALL_ACCESS,
	};

	CHECK(ibv_modify_qp(a->qp, &attr,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTR;
	attr.path_mtu = IBV_MTU_1024;
	attr.dest_qp_num = b->qp->qp_num;
	attr.rq_psn = 0;
	attr.max_dest_rd_atomic = 4;
	attr.min_rnr_timer = 12;
	attr.ah_attr.port_num = 1;
	attr.ah_attr.dlid = b->port.lid;
	if (b->port.link_layer == IBV_LINK_LAYER_ETHERNET) {
		attr.ah_attr.is_global = 1;
		attr.ah_attr.grh.dgid = b->gid;
		attr.ah_attr.grh.hop_limit = 1;
	}
	CHECK(ibv_modify_qp(a->qp, &attr,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0);
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTS;
	attr.timeout = 14;
	attr.retry_cnt = 7;
	attr.rnr_retry = 7;
	attr.sq_psn = 0;
	attr.max_rd_atomic = 4;
	CHECK(ibv_modify_qp(a->qp, &attr,
			    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
	CHECK(a->qp->state == IBV_QPS_RTS);
}

/* Two sides on the first two devices, connected to each other. */
static inline void setup_pair(struct ibv_device **list, struct side *a, struct side *b)
{
	memset(a, 0, sizeof(*a));
	memset(b, 0, sizeof(*b));
	setup(a, list[0]);
	setup(b, list[1]);
	connect_to(a, b);
	connect_to(b, a);
}

/* Seconds on the monotonic clock. */
static inline double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* How long a wait for a completion may last: a guard against a hang, not a measure. (A count
 * of polls was no guard: an empty poll costs a few ns on a fast machine, and 10^8 of them
 * ran out before a retry timer of 0.5 s.) */
#define WAIT_LIMIT_S 30.0

/* Whether a wait that began at `t0` (now_s) may go on; checks the clock every 1024th call. */
static inline int waiting(double t0, long i)
{
	return (i & 1023) != 0 || now_s() - t0 < WAIT_LIMIT_S;
}

static inline struct ibv_wc wait_wc(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	double t0 = now_s();
	for (long i = 0; waiting(t0, i); i++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0);
		if (n == 1)
			return wc;
	}
	fprintf(stderr, "no completion\n");
	exit(1);
}

#endif
