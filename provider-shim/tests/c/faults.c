/* Fault injection from C, in simulation (run with RDMA_EMU_SEED=7 and
 * RDMA_EMU_FAULTS="drop:op=write,nth=1"): every kind of fault with the completions and events
 * it must give (a lost WRITE retransmitted, an RNR storm ridden out, a port flap, a duplicated
 * atomic executed once, a delayed ACK, reordered SENDs taken in order, a corrupted WRITE, a
 * healed partition, a dead link ending in IBV_WC_RETRY_EXC_ERR and a flush, device fatal, CQ
 * overrun), and the control functions' errors. The control functions are looked up with dlsym, as a
 * program that also runs on real hardware would. */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "common.h"
#include "rdma_emu.h"

static typeof(rdma_emu_set_faults) *set_faults;
static typeof(rdma_emu_fault_hits) *fault_hits;
static typeof(rdma_emu_seed) *seed_of;

static void teardown(struct side *s)
{
	CHECK(ibv_destroy_qp(s->qp) == 0);
	CHECK(ibv_destroy_cq(s->cq) == 0);
	CHECK(ibv_destroy_comp_channel(s->ch) == 0);
	CHECK(ibv_dereg_mr(s->mr) == 0);
	CHECK(ibv_dealloc_pd(s->pd) == 0);
	CHECK(ibv_close_device(s->ctx) == 0);
	free(s->buf);
}

static void post_write(struct side *a, struct side *b, uint64_t id)
{
	struct ibv_sge sge = { (uintptr_t)a->buf, 8, a->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;
	wr.wr.rdma.remote_addr = (uintptr_t)b->buf;
	wr.wr.rdma.rkey = b->mr->rkey;
	CHECK(ibv_post_send(a->qp, &wr, &bad) == 0);
}

static void post_recv(struct side *s, uint64_t id)
{
	struct ibv_sge sge = { (uintptr_t)s->buf + 64 * (1 + id % 8), 64, s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(s->qp, &wr, &bad) == 0);
}

/* Waits for the next async event of `s`, polling `cq` meanwhile (an empty poll lets virtual
 * time run to the next deadline). */
static enum ibv_event_type next_event(struct side *s, struct ibv_cq *cq)
{
	struct ibv_async_event ev;
	struct ibv_wc wc;
	for (long i = 0; i < 10000000L; i++) {
		if (ibv_get_async_event(s->ctx, &ev) == 0) {
			enum ibv_event_type t = ev.event_type;
			ibv_ack_async_event(&ev);
			return t;
		}
		CHECK(errno == EAGAIN);
		CHECK(ibv_poll_cq(cq, 1, &wc) == 0);
	}
	fprintf(stderr, "no event\n");
	exit(1);
}

/* Waits for an event of type `t`, skipping others (QP errors the full profile raises). */
static void wait_event(struct side *s, struct ibv_cq *cq, enum ibv_event_type t)
{
	for (int i = 0; i < 8; i++)
		if (next_event(s, cq) == t)
			return;
	fprintf(stderr, "no event %d\n", t);
	exit(1);
}

static void post_send(struct side *a, enum ibv_wr_opcode op, uint64_t id, uint32_t off)
{
	struct ibv_sge sge = { (uintptr_t)a->buf + off, 8, a->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	CHECK(ibv_post_send(a->qp, &wr, &bad) == 0);
}

/* One fetch-and-add of 5 at the peer's buf + 1024. */
static void post_add(struct side *a, struct side *b, uint64_t id)
{
	struct ibv_sge sge = { (uintptr_t)a->buf + 1024, 8, a->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.atomic.remote_addr = (uintptr_t)b->buf + 1024;
	wr.wr.atomic.rkey = b->mr->rkey;
	wr.wr.atomic.compare_add = 5;
	CHECK(ibv_post_send(a->qp, &wr, &bad) == 0);
}

static void expect_ok(struct ibv_cq *cq, uint64_t id)
{
	struct ibv_wc wc = wait_wc(cq);
	if (wc.wr_id != id || wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "wr %lu: %s\n", (unsigned long)wc.wr_id, ibv_wc_status_str(wc.status));
		exit(1);
	}
}

static uint64_t hits_of_first_rule(struct ibv_context *c)
{
	uint64_t h = 0;
	CHECK(fault_hits(c, &h, 1) == 1);
	return h;
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct side a, b;
	struct ibv_wc wc;
	uint64_t hits[4] = { 0 };
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;

	set_faults = dlsym(RTLD_DEFAULT, "rdma_emu_set_faults");
	fault_hits = dlsym(RTLD_DEFAULT, "rdma_emu_fault_hits");
	seed_of = dlsym(RTLD_DEFAULT, "rdma_emu_seed");
	CHECK(set_faults && fault_hits && seed_of);
	CHECK(list && n >= 2);
	setup_pair(list, &a, &b);
	CHECK(seed_of(a.ctx) == 7);

	/* RDMA_EMU_FAULTS drops the first WRITE: it is retransmitted after the ACK timeout. */
	memcpy(a.buf, "payload!", 8);
	post_write(&a, &b, 1);
	wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS);
	CHECK(memcmp(b.buf, "payload!", 8) == 0);
	CHECK(fault_hits(a.ctx, hits, 4) == 1 && hits[0] == 1);

	/* Every SEND is refused twice with an RNR NAK, then taken. */
	CHECK(set_faults(a.ctx, "rnr:count=2") == 0);
	post_recv(&b, 7);
	post_send(&a, IBV_WR_SEND, 2, 0);
	expect_ok(a.cq, 2);
	expect_ok(b.cq, 7);
	CHECK(hits_of_first_rule(a.ctx) == 2);

	/* A port flap: PORT_ERR, then PORT_ACTIVE 10 ms (virtual) later. */
	CHECK(set_faults(a.ctx, "port-down:dev=emu1,port=1,for=10ms") == 0);
	CHECK(next_event(&b, a.cq) == IBV_EVENT_PORT_ERR);
	CHECK(next_event(&b, a.cq) == IBV_EVENT_PORT_ACTIVE);

	/* A duplicated atomic is executed once: the copy is answered from the saved result. */
	CHECK(set_faults(a.ctx, "dup:op=atomic") == 0);
	post_add(&a, &b, 3);
	expect_ok(a.cq, 3);
	CHECK(*(uint64_t *)(b.buf + 1024) == 5 && *(uint64_t *)(a.buf + 1024) == 0);
	CHECK(hits_of_first_rule(a.ctx) == 1);

	/* A delayed ACK, then a corrupted WRITE (dropped by the receiver, retransmitted). */
	CHECK(set_faults(a.ctx, "delay:op=ack,by=5ms,count=1; corrupt:op=write,nth=2") == 0);
	post_write(&a, &b, 4);
	expect_ok(a.cq, 4);
	post_write(&a, &b, 5);
	expect_ok(a.cq, 5);
	CHECK(fault_hits(a.ctx, hits, 4) == 2 && hits[0] == 1 && hits[1] == 1);

	/* Two SENDs swapped on the wire arrive in order, each once. */
	CHECK(set_faults(a.ctx, "reorder:op=send,nth=1") == 0);
	post_recv(&b, 1);
	post_recv(&b, 2);
	memcpy(a.buf + 8, "first!!!second!!", 16);
	post_send(&a, IBV_WR_SEND, 6, 8);
	post_send(&a, IBV_WR_SEND, 7, 16);
	expect_ok(a.cq, 6);
	expect_ok(a.cq, 7);
	expect_ok(b.cq, 1);
	expect_ok(b.cq, 2);
	CHECK(memcmp(b.buf + 128, "first!!!", 8) == 0 && memcmp(b.buf + 192, "second!!", 8) == 0);

	/* A partition shorter than the retries (7 x 67 ms) heals. */
	CHECK(set_faults(a.ctx, "partition:a=emu0,b=emu1,for=100ms") == 0);
	post_write(&a, &b, 8);
	expect_ok(a.cq, 8);
	CHECK(hits_of_first_rule(a.ctx) >= 2);

	/* A dead link: the WRITE is retried retry_cnt (7) times, then fails; the next flushes. */
	CHECK(set_faults(a.ctx, "drop:op=request") == 0);
	post_write(&a, &b, 9);
	post_write(&a, &b, 10);
	wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 9 && wc.status == IBV_WC_RETRY_EXC_ERR);
	wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 10 && wc.status == IBV_WC_WR_FLUSH_ERR);
	CHECK(ibv_query_qp(a.qp, &attr, IBV_QP_STATE, &init) == 0 && attr.qp_state == IBV_QPS_ERR);
	CHECK(hits_of_first_rule(a.ctx) == 16);

	/* Device fatal on emu1: DEVICE_FATAL, and its QP's receives are flushed. */
	post_recv(&b, 11);
	CHECK(set_faults(a.ctx, "device-fatal:dev=emu1") == 0);
	wait_event(&b, a.cq, IBV_EVENT_DEVICE_FATAL);
	wc = wait_wc(b.cq);
	CHECK(wc.wr_id == 11 && wc.status == IBV_WC_WR_FLUSH_ERR);
	CHECK(ibv_query_qp(b.qp, &attr, IBV_QP_STATE, &init) == 0 && attr.qp_state == IBV_QPS_ERR);

	/* CQ overrun of a's send CQ: CQ_ERR. */
	{
		char rule[64];
		snprintf(rule, sizeof(rule), "cq-overrun:qp=%u", a.qp->qp_num);
		CHECK(set_faults(a.ctx, rule) == 0);
		wait_event(&a, b.cq, IBV_EVENT_CQ_ERR);
	}

	/* Bad input. */
	CHECK(set_faults(a.ctx, "drop:p=7") == EINVAL);
	CHECK(set_faults(a.ctx, "explode") == EINVAL);
	CHECK(set_faults(NULL, "drop") == EINVAL);
	CHECK(fault_hits(NULL, hits, 4) == -1);
	CHECK(fault_hits(a.ctx, NULL, 0) == 1);
	CHECK(set_faults(a.ctx, NULL) == 0);
	CHECK(fault_hits(a.ctx, hits, 4) == 0);

	teardown(&a);
	teardown(&b);
	ibv_free_device_list(list);
	printf("faults ok\n");
	return 0;
}
