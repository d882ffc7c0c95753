/* Thread domains and parent domains (full profile, as mlx5): a parent domain stands for its PD
 * (QPs, SRQs, MRs; CQs through IBV_CQ_INIT_ATTR_MASK_PD), keeps its PD and thread domain busy,
 * and its allocator is asked for the queue buffers and doorbell records of what is made
 * through it, with mlx5's resource types, and given them back when those go. The rxe profile
 * has neither (EOPNOTSUPP, as rxe). */
#include <infiniband/mlx5dv.h>

#include "common.h"

#define MAX_CALLS 64
static struct call {
	int alloc; /* 1: alloc, 0: free */
	struct ibv_pd *pd;
	void *pd_context;
	size_t size, alignment;
	uint64_t type;
	void *ptr;
} calls[MAX_CALLS];
static int ncalls, fail_type_qp, default_dbr;
static int marker;

static void *my_alloc(struct ibv_pd *pd, void *pd_context, size_t size, size_t alignment,
		      uint64_t type)
{
	void *p = NULL;
	if (type == MLX5DV_RES_TYPE_QP && fail_type_qp)
		p = NULL;
	else if (type == MLX5DV_RES_TYPE_DBR && default_dbr)
		p = IBV_ALLOCATOR_USE_DEFAULT;
	else
		CHECK(posix_memalign(&p, alignment, size) == 0);
	CHECK(ncalls < MAX_CALLS);
	calls[ncalls++] = (struct call){ 1, pd, pd_context, size, alignment, type, p };
	return p;
}

static void my_free(struct ibv_pd *pd, void *pd_context, void *ptr, uint64_t type)
{
	CHECK(ncalls < MAX_CALLS);
	calls[ncalls++] = (struct call){ 0, pd, pd_context, 0, 0, type, ptr };
	free(ptr);
}

/* The index of the first call since `from` of kind `alloc` and `type`, or -1. */
static int find(int from, int alloc, uint64_t type)
{
	for (int i = from; i < ncalls; i++)
		if (calls[i].alloc == alloc && calls[i].type == type)
			return i;
	return -1;
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	const char *profile = getenv("RDMA_EMU_PROFILE");
	int rxe = profile && strcmp(profile, "rxe") == 0;
	struct side a = { 0 }, b = { 0 };
	struct ibv_td_init_attr tda = { 0 };

	CHECK(list && list[0] && list[1]);
	setup_base(&a, list[0]);
	if (rxe) {
		struct ibv_parent_domain_init_attr pa = { .pd = a.pd };
		CHECK(!ibv_alloc_td(a.ctx, &tda) && errno == EOPNOTSUPP);
		CHECK(!ibv_alloc_parent_domain(a.ctx, &pa) && errno == EOPNOTSUPP);
		printf("parent ok\n");
		return 0;
	}
	setup(&b, list[1]);

	/* Thread domain: comp_mask must be 0. */
	tda.comp_mask = 1;
	CHECK(!ibv_alloc_td(a.ctx, &tda) && errno == EINVAL);
	tda.comp_mask = 0;
	struct ibv_td *td = ibv_alloc_td(a.ctx, &tda);
	CHECK(td && td->context == a.ctx);

	struct ibv_parent_domain_init_attr pa = {
		.pd = a.pd, .td = td, .alloc = my_alloc, .free = my_free, .pd_context = &marker,
		.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
	};
	struct ibv_parent_domain_init_attr bad = pa;
	bad.pd = NULL;
	CHECK(!ibv_alloc_parent_domain(a.ctx, &bad) && errno == EINVAL);
	bad = pa;
	bad.comp_mask |= 1 << 5;
	CHECK(!ibv_alloc_parent_domain(a.ctx, &bad) && errno == EINVAL);
	struct ibv_pd *parent = ibv_alloc_parent_domain(a.ctx, &pa);
	CHECK(parent && parent->context == a.ctx && parent->handle == a.pd->handle);
	bad = pa;
	bad.pd = parent; /* a parent domain is no protection domain */
	CHECK(!ibv_alloc_parent_domain(a.ctx, &bad) && errno == EINVAL);
	CHECK(ibv_dealloc_pd(a.pd) == EBUSY && ibv_dealloc_td(td) == EBUSY);

	/* A CQ of the parent domain: its buffer and doorbell record from the allocator. */
	struct ibv_cq_init_attr_ex ca = { .cqe = 16, .wc_flags = IBV_WC_STANDARD_FLAGS,
		.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD, .parent_domain = a.pd };
	CHECK(!ibv_create_cq_ex(a.ctx, &ca) && errno == EINVAL); /* not a parent domain */
	ca.parent_domain = parent;
	int mark = ncalls;
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(a.ctx, &ca);
	CHECK(cqx);
	int cqbuf = find(mark, 1, MLX5DV_RES_TYPE_CQ), cqdbr = find(mark, 1, MLX5DV_RES_TYPE_DBR);
	CHECK(cqbuf >= 0 && cqdbr >= 0);
	CHECK(calls[cqbuf].pd == parent && calls[cqbuf].pd_context == &marker);
	CHECK(calls[cqbuf].size >= 17 * 64 && calls[cqbuf].alignment == 4096);
	CHECK(calls[cqdbr].size == 8 && calls[cqdbr].alignment == 8);
	a.cq = ibv_cq_ex_to_cq(cqx);

	/* A QP through the parent domain: on its PD, its rings from the allocator. */
	struct ibv_qp_init_attr qa = { .send_cq = a.cq, .recv_cq = a.cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 2,
			 .max_inline_data = 64 } };
	mark = ncalls;
	CHECK(a.qp = ibv_create_qp(parent, &qa));
	CHECK(a.qp->pd == parent);
	int qpbuf = find(mark, 1, MLX5DV_RES_TYPE_QP), qpdbr = find(mark, 1, MLX5DV_RES_TYPE_DBR);
	CHECK(qpbuf >= 0 && qpdbr >= 0 && calls[qpbuf].size >= 16 * 64 && calls[qpbuf].alignment == 4096);
	/* An allocator that fails: no QP (ENOMEM), and what it gave before goes back. */
	fail_type_qp = 1;
	CHECK(!ibv_create_qp(parent, &qa) && errno == ENOMEM);
	fail_type_qp = 0;
	/* An MR through the parent domain works on its PD; the data path over it. */
	struct ibv_mr *pmr = ibv_reg_mr(parent, a.buf, BUF, ALL_ACCESS);
	CHECK(pmr && pmr->pd == parent);
	CHECK(ibv_dereg_mr(a.mr) == 0);
	a.mr = pmr;
	connect_to(&a, &b);
	connect_to(&b, &a);
	memcpy(a.buf, "parental", 8);
	struct ibv_sge sge = { (uintptr_t)a.buf, 8, a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 5, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *badwr;
	wr.wr.rdma.remote_addr = (uintptr_t)b.buf + 64;
	wr.wr.rdma.rkey = b.mr->rkey;
	CHECK(ibv_post_send(a.qp, &wr, &badwr) == 0);
	struct ibv_wc wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 5 && wc.status == IBV_WC_SUCCESS && memcmp(b.buf + 64, "parental", 8) == 0);

	/* An SRQ, its doorbell record left to the provider (IBV_ALLOCATOR_USE_DEFAULT). */
	default_dbr = 1;
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };
	mark = ncalls;
	struct ibv_srq *srq = ibv_create_srq(parent, &sa);
	CHECK(srq && srq->pd == parent && find(mark, 1, MLX5DV_RES_TYPE_SRQ) >= 0);
	default_dbr = 0;

	/* In use: the parent domain stays. Then everything goes back through free. */
	CHECK(ibv_dealloc_pd(parent) == EBUSY);
	mark = ncalls;
	CHECK(ibv_destroy_qp(a.qp) == 0);
	int qpfree = find(mark, 0, MLX5DV_RES_TYPE_QP), dbrfree = find(mark, 0, MLX5DV_RES_TYPE_DBR);
	CHECK(qpfree >= 0 && calls[qpfree].ptr == calls[qpbuf].ptr && calls[qpfree].pd == parent);
	CHECK(dbrfree >= 0 && calls[dbrfree].ptr == calls[qpdbr].ptr);
	mark = ncalls;
	CHECK(ibv_destroy_srq(srq) == 0);
	CHECK(find(mark, 0, MLX5DV_RES_TYPE_SRQ) >= 0 && find(mark, 0, MLX5DV_RES_TYPE_DBR) < 0);
	CHECK(ibv_destroy_cq(a.cq) == 0);
	CHECK(ibv_dereg_mr(pmr) == 0);
	/* Every buffer given was given back. */
	int given = 0, back = 0;
	for (int i = 0; i < ncalls; i++) {
		if (calls[i].alloc && calls[i].ptr && calls[i].ptr != IBV_ALLOCATOR_USE_DEFAULT)
			given++;
		if (!calls[i].alloc)
			back++;
	}
	CHECK(given == back);
	CHECK(ibv_dealloc_pd(parent) == 0);
	CHECK(ibv_dealloc_td(td) == 0);

	/* Without allocators, a parent domain only stands for its PD. */
	struct ibv_parent_domain_init_attr plain = { .pd = a.pd };
	CHECK(parent = ibv_alloc_parent_domain(a.ctx, &plain));
	mark = ncalls;
	struct ibv_cq *cq2 = ibv_create_cq(a.ctx, 4, NULL, NULL, 0);
	qa.send_cq = qa.recv_cq = cq2;
	struct ibv_qp *qp2 = ibv_create_qp(parent, &qa);
	CHECK(cq2 && qp2 && ncalls == mark);
	CHECK(ibv_destroy_qp(qp2) == 0 && ibv_destroy_cq(cq2) == 0 && ibv_dealloc_pd(parent) == 0);
	CHECK(ibv_dealloc_pd(a.pd) == 0);
	printf("parent ok\n");
	return 0;
}
