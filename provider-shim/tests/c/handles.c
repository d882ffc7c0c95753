/* Kernel handles: every object the kernel knows has a handle of its own, and a verb the kernel
 * runs on that handle fails when the application changed the struct's handle, or its context
 * to one over other objects, as the kernel's lookup in that command file fails: ENOENT, for
 * every command (as recorded on Linux 6.1's rxe: destroys, modify, query, resize, registration
 * and creates in a PD). The object stays alive and is destroyed once the struct is put back.
 * mlx5 (the full profile) makes AHs on InfiniBand in user space only: handle 0, no check. */
#include "common.h"

static int rxe;

/* Corrupts *handle, runs `call` expecting `want` (a return value, and errno when `err`),
 * then puts the handle back. */
#define WITH_BAD_HANDLE(handle, call, want, err)                    \
	do {                                                        \
		uint32_t saved_ = (handle);                         \
		(handle) = saved_ ^ 0x5a5a;                         \
		int err_ = (err);                                   \
		errno = 0;                                          \
		CHECK((call) == (want));                            \
		if (err_)                                           \
			CHECK(errno == err_);                       \
		(handle) = saved_;                                  \
	} while (0)

/* The same with the struct's context swapped for `other`. */
#define WITH_OTHER_CONTEXT(context, other, call, want, err)         \
	do {                                                        \
		struct ibv_context *saved_ = (context);             \
		(context) = (other);                                \
		int err_ = (err);                                   \
		errno = 0;                                          \
		CHECK((call) == (want));                            \
		if (err_)                                           \
			CHECK(errno == err_);                       \
		(context) = saved_;                                 \
	} while (0)

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	const char *profile = getenv("RDMA_EMU_PROFILE");
	rxe = profile && strcmp(profile, "rxe") == 0;
	CHECK(list && list[0]);
	struct ibv_context *c = ibv_open_device(list[0]), *other = ibv_open_device(list[0]);
	CHECK(c && other);
	struct ibv_port_attr port;
	CHECK(ibv_query_port(c, 1, &port) == 0);
	int roce = port.link_layer == IBV_LINK_LAYER_ETHERNET;

	struct ibv_pd *pd = ibv_alloc_pd(c);
	struct ibv_cq *cq = ibv_create_cq(c, 8, NULL, NULL, 0);
	struct ibv_cq_init_attr_ex cqa = { .cqe = 8, .wc_flags = IBV_WC_STANDARD_FLAGS };
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(c, &cqa);
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	char *buf = calloc(1, BUF);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, BUF, ALL_ACCESS);
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	struct ibv_ah_attr aa = { .dlid = port.lid ? port.lid : 1, .port_num = 1, .is_global = roce };
	if (roce)
		CHECK(ibv_query_gid(c, 1, 0, &aa.grh.dgid) == 0);
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(pd && cq && cqx && srq && qp && buf && mr && mw && ah);
	struct ibv_cq *cqb = ibv_cq_ex_to_cq(cqx);

	/* Handles: all different (one numbering per command file, as the kernel's, which counts
	 * from 0; the emulator counts from 1 and keeps 0 for objects the kernel does not know). */
	int kernel_ah = rxe || roce;
	uint32_t h[] = { pd->handle, cq->handle, cqb->handle, srq->handle, qp->handle, mr->handle,
			 mw->handle, kernel_ah ? ah->handle : 0xffffffff };
	for (unsigned i = 0; i < sizeof(h) / sizeof(h[0]); i++) {
		CHECK(h[i] != 0);
		for (unsigned j = 0; j < i; j++)
			CHECK(h[i] != h[j]);
	}
	if (!kernel_ah)
		CHECK(ah->handle == 0);

	/* Commands on the object: ENOENT. */
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	struct ibv_qp_init_attr init;
	WITH_BAD_HANDLE(qp->handle, ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
					IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), ENOENT, 0);
	WITH_BAD_HANDLE(qp->handle, ibv_query_qp(qp, &attr, IBV_QP_STATE, &init), ENOENT, 0);
	WITH_OTHER_CONTEXT(qp->context, other, ibv_query_qp(qp, &attr, IBV_QP_STATE, &init), ENOENT, 0);
	CHECK(ibv_query_qp(qp, &attr, IBV_QP_STATE, &init) == 0 && attr.qp_state == IBV_QPS_RESET);
	struct ibv_srq_attr sattr = { .srq_limit = 1 };
	WITH_BAD_HANDLE(srq->handle, ibv_modify_srq(srq, &sattr, IBV_SRQ_LIMIT), ENOENT, 0);
	WITH_BAD_HANDLE(srq->handle, ibv_query_srq(srq, &sattr), ENOENT, 0);
	WITH_BAD_HANDLE(cq->handle, ibv_resize_cq(cq, 16), ENOENT, 0);
	WITH_BAD_HANDLE(pd->handle, ibv_reg_mr(pd, buf, 64, ALL_ACCESS), NULL, ENOENT);
	WITH_OTHER_CONTEXT(pd->context, other, ibv_reg_mr(pd, buf, 64, ALL_ACCESS), NULL, ENOENT);
	WITH_BAD_HANDLE(pd->handle, ibv_alloc_mw(pd, IBV_MW_TYPE_2), NULL, ENOENT);
	if (kernel_ah)
		WITH_BAD_HANDLE(pd->handle, ibv_create_ah(pd, &aa), NULL, ENOENT);
	if (rxe) /* rxe arms a CQ through the kernel */
		WITH_BAD_HANDLE(cq->handle, ibv_req_notify_cq(cq, 0), ENOENT, 0);
	/* Creates naming it: ENOENT. */
	WITH_BAD_HANDLE(pd->handle, ibv_create_qp(pd, &qa), NULL, ENOENT);
	WITH_BAD_HANDLE(cq->handle, ibv_create_qp(pd, &qa), NULL, ENOENT);
	WITH_BAD_HANDLE(pd->handle, ibv_create_srq(pd, &sa), NULL, ENOENT);
	/* Re-registration (mlx5: the kernel's lookup; rxe: no rereg at all). */
	WITH_BAD_HANDLE(mr->handle, ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
						 IBV_ACCESS_LOCAL_WRITE),
			IBV_REREG_MR_ERR_CMD, rxe ? EOPNOTSUPP : ENOENT);

	/* Destroys: ENOENT, and the object lives on. */
	WITH_BAD_HANDLE(mw->handle, ibv_dealloc_mw(mw), ENOENT, ENOENT);
	WITH_OTHER_CONTEXT(mw->context, other, ibv_dealloc_mw(mw), ENOENT, ENOENT);
	CHECK(ibv_dealloc_mw(mw) == 0);
	if (kernel_ah) {
		WITH_BAD_HANDLE(ah->handle, ibv_destroy_ah(ah), ENOENT, ENOENT);
		WITH_OTHER_CONTEXT(ah->context, other, ibv_destroy_ah(ah), ENOENT, ENOENT);
	} else {
		/* A user-space AH: the struct's handle means nothing to the provider. */
		ah->handle = 0x5a5a;
	}
	CHECK(ibv_destroy_ah(ah) == 0);
	WITH_BAD_HANDLE(qp->handle, ibv_destroy_qp(qp), ENOENT, ENOENT);
	WITH_OTHER_CONTEXT(qp->context, other, ibv_destroy_qp(qp), ENOENT, ENOENT);
	CHECK(ibv_destroy_qp(qp) == 0);
	WITH_BAD_HANDLE(srq->handle, ibv_destroy_srq(srq), ENOENT, ENOENT);
	CHECK(ibv_destroy_srq(srq) == 0);
	WITH_BAD_HANDLE(mr->handle, ibv_dereg_mr(mr), ENOENT, ENOENT);
	WITH_OTHER_CONTEXT(mr->context, other, ibv_dereg_mr(mr), ENOENT, ENOENT);
	CHECK(ibv_dereg_mr(mr) == 0);
	WITH_BAD_HANDLE(cq->handle, ibv_destroy_cq(cq), ENOENT, ENOENT);
	CHECK(ibv_destroy_cq(cq) == 0);
	WITH_BAD_HANDLE(cqb->handle, ibv_destroy_cq(cqb), ENOENT, ENOENT);
	WITH_OTHER_CONTEXT(cqb->context, other, ibv_destroy_cq(cqb), ENOENT, ENOENT);
	CHECK(ibv_destroy_cq(cqb) == 0);
	WITH_BAD_HANDLE(pd->handle, ibv_dealloc_pd(pd), ENOENT, ENOENT);
	WITH_OTHER_CONTEXT(pd->context, other, ibv_dealloc_pd(pd), ENOENT, ENOENT);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(other) == 0 && ibv_close_device(c) == 0);
	free(buf);
	ibv_free_device_list(list);
	printf("handles ok\n");
	return 0;
}
