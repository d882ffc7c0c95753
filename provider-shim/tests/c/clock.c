/* The device clock and CQ moderation through the C ABI: ibv_query_device_ex's clock and
 * cq_mod_caps, ibv_query_rt_values_ex, completion timestamps (raw and wall clock) read with
 * ibv_wc_read_completion_ts / _wallclock_ns, ibv_modify_cq and its errors, and the moderated
 * completion event. Run on a simulated fabric (RDMA_EMU_SEED): virtual time stands still while
 * the program works, so a moderation period cannot end between two steps. On the rxe profile
 * every one of these is refused as rxe refuses it. Prints "clock ok". */
#include <poll.h>
#include <time.h>

#include "common.h"

#define TS_FLAGS (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)

static int readable(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, 0) == 1;
}

static uint64_t raw_clock(struct ibv_context *ctx)
{
	struct ibv_values_ex v = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	CHECK(ibv_query_rt_values_ex(ctx, &v) == 0);
	CHECK(v.comp_mask == IBV_VALUES_MASK_RAW_CLOCK && v.raw_clock.tv_sec == 0);
	return (uint64_t)v.raw_clock.tv_nsec;
}

/* `n` SENDs of nothing in one ibv_post_send. */
static void send_burst(struct side *a, uint64_t first, int n)
{
	struct ibv_send_wr wr[4], *bad;
	CHECK(n <= 4);
	memset(wr, 0, sizeof(wr));
	for (int i = 0; i < n; i++) {
		wr[i].wr_id = first + i;
		wr[i].opcode = IBV_WR_SEND;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
	}
	CHECK(ibv_post_send(a->qp, wr, &bad) == 0);
}

static void rxe_refuses(struct ibv_device **list)
{
	struct side a = { 0 };
	struct ibv_device_attr_ex d;

	setup(&a, list[0]);
	CHECK(ibv_query_device_ex(a.ctx, NULL, &d) == 0);
	CHECK(d.completion_timestamp_mask == 0 && d.hca_core_clock == 0);
	CHECK(d.cq_mod_caps.max_cq_count == 0 && d.cq_mod_caps.max_cq_period == 0);
	struct ibv_cq_init_attr_ex ts = { .cqe = 4, .wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP };
	errno = 0;
	CHECK(ibv_create_cq_ex(a.ctx, &ts) == NULL && errno == EOPNOTSUPP);
	struct ibv_modify_cq_attr m = { .attr_mask = IBV_CQ_ATTR_MODERATE,
					.moderate = { .cq_count = 8, .cq_period = 16 } };
	CHECK(ibv_modify_cq(a.cq, &m) == EOPNOTSUPP);
	struct ibv_values_ex v = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	CHECK(ibv_query_rt_values_ex(a.ctx, &v) == EOPNOTSUPP);
}

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	struct ibv_device_attr_ex d;
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	const char *profile = getenv("RDMA_EMU_PROFILE");

	CHECK(list && n >= 2);
	if (profile && strcmp(profile, "rxe") == 0) {
		rxe_refuses(list);
		printf("clock ok\n");
		return 0;
	}

	/* b's CQ stamps its completions. */
	setup(&a, list[0]);
	setup_base(&b, list[1]);
	CHECK(ibv_query_device_ex(b.ctx, NULL, &d) == 0);
	CHECK(d.completion_timestamp_mask == UINT64_MAX && d.hca_core_clock == 1000000);
	CHECK(d.cq_mod_caps.max_cq_count == 65535 && d.cq_mod_caps.max_cq_period == 4095);
	struct ibv_cq_init_attr_ex ca = { .cqe = 32, .cq_context = &b, .channel = b.ch,
					  .wc_flags = IBV_WC_STANDARD_FLAGS | TS_FLAGS };
	CHECK(b.cqx = ibv_create_cq_ex(b.ctx, &ca));
	b.cq = ibv_cq_ex_to_cq(b.cqx);
	struct ibv_qp_init_attr qa = {
		.send_cq = b.cq, .recv_cq = b.cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	CHECK(b.qp = ibv_create_qp(b.pd, &qa));
	connect_to(&a, &b);
	connect_to(&b, &a);
	for (int i = 0; i < 8; i++) {
		struct ibv_sge s = { .addr = (uintptr_t)b.buf, .length = 64, .lkey = b.mr->lkey };
		struct ibv_recv_wr r = { .wr_id = 100 + i, .sg_list = &s, .num_sge = 1 }, *bad;
		CHECK(ibv_post_recv(b.qp, &r, &bad) == 0);
	}

	/* The raw clock; a mask bit it does not know is refused. */
	struct ibv_values_ex bad_mask = { .comp_mask = 2 };
	CHECK(ibv_query_rt_values_ex(b.ctx, &bad_mask) == EINVAL);
	uint64_t t0 = raw_clock(b.ctx);

	/* ibv_modify_cq's checks. */
	struct ibv_modify_cq_attr m = { .attr_mask = 0, .moderate = { .cq_count = 3, .cq_period = 1000 } };
	CHECK(ibv_modify_cq(b.cq, &m) == EINVAL);
	m.attr_mask = IBV_CQ_ATTR_MODERATE | 2;
	CHECK(ibv_modify_cq(b.cq, &m) == EINVAL);
	m.attr_mask = IBV_CQ_ATTR_MODERATE;
	m.moderate.cq_period = 4096;
	CHECK(ibv_modify_cq(b.cq, &m) == EINVAL);
	m.moderate.cq_period = 1000;
	CHECK(ibv_modify_cq(b.cq, &m) == 0);

	/* The count: two completions are held, the third sends the event. */
	CHECK(ibv_req_notify_cq(b.cq, 0) == 0);
	send_burst(&a, 1, 2);
	CHECK(!readable(b.ch->fd));
	send_burst(&a, 3, 1);
	CHECK(readable(b.ch->fd));
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	CHECK(ibv_get_cq_event(b.ch, &ev_cq, &ev_ctx) == 0 && ev_cq == b.cq && ev_ctx == &b);
	ibv_ack_cq_events(b.cq, 1);
	struct ibv_poll_cq_attr pa = { 0 };
	uint64_t last = 0;
	CHECK(ibv_start_poll(b.cqx, &pa) == 0);
	for (int i = 0; i < 3; i++) {
		if (i > 0)
			CHECK(ibv_next_poll(b.cqx) == 0);
		CHECK(b.cqx->status == IBV_WC_SUCCESS && b.cqx->wr_id == 100 + (uint64_t)i);
		uint64_t ts = ibv_wc_read_completion_ts(b.cqx);
		CHECK(ts >= t0 && ts >= last);
		last = ts;
		/* The wall clock of the stamp is today's (within a minute). */
		uint64_t wall = ibv_wc_read_completion_wallclock_ns(b.cqx);
		struct timespec now;
		clock_gettime(CLOCK_REALTIME, &now);
		uint64_t now_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
		CHECK(wall + 60000000000ull > now_ns && wall < now_ns + 60000000000ull);
	}
	CHECK(ibv_next_poll(b.cqx) == ENOENT);
	ibv_end_poll(b.cqx);

	/* The period: one completion, and the event 1000 us (of device clock) after it. */
	CHECK(ibv_req_notify_cq(b.cq, 0) == 0);
	send_burst(&a, 4, 1);
	CHECK(!readable(b.ch->fd));
	CHECK(ibv_get_cq_event(b.ch, &ev_cq, &ev_ctx) == 0 && ev_cq == b.cq);
	uint64_t fired = raw_clock(b.ctx);
	ibv_ack_cq_events(b.cq, 1);
	CHECK(ibv_start_poll(b.cqx, &pa) == 0 && b.cqx->wr_id == 103);
	CHECK(fired >= ibv_wc_read_completion_ts(b.cqx) + 1000 * 1000);
	ibv_end_poll(b.cqx);

	printf("clock ok\n");
	return 0;
}
