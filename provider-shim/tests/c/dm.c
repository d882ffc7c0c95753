/* Device memory through the C ABI: ibv_alloc_dm and its checks, ibv_memcpy_to_dm /
 * ibv_memcpy_from_dm (whole words inside the allocation), ibv_reg_dm_mr (zero-based, addr
 * NULL) reached by a peer's RDMA WRITE and READ, ibv_free_dm busy while an MR uses it. On the
 * rxe profile libibverbs refuses it all, as on rxe. Prints "dm ok". */
#include "common.h"

#define DM_ACCESS (ALL_ACCESS | IBV_ACCESS_ZERO_BASED)

int main(void)
{
	struct side a, b;
	struct ibv_device_attr_ex d;
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	const char *profile = getenv("RDMA_EMU_PROFILE");

	CHECK(list && n >= 2);
	setup_pair(list, &a, &b);
	CHECK(ibv_query_device_ex(b.ctx, NULL, &d) == 0);
	struct ibv_alloc_dm_attr attr = { .length = 4096 };
	if (profile && strcmp(profile, "rxe") == 0) {
		CHECK(d.max_dm_size == 0);
		errno = 0;
		CHECK(ibv_alloc_dm(b.ctx, &attr) == NULL && errno == EOPNOTSUPP);
		printf("dm ok\n");
		return 0;
	}
	CHECK(d.max_dm_size == 256 * 1024);

	/* Allocation checks. */
	struct ibv_alloc_dm_attr bad = { .length = 64, .comp_mask = 1 };
	errno = 0;
	CHECK(ibv_alloc_dm(b.ctx, &bad) == NULL && errno == EINVAL);
	bad.comp_mask = 0;
	bad.length = d.max_dm_size + 1;
	errno = 0;
	CHECK(ibv_alloc_dm(b.ctx, &bad) == NULL && errno == EINVAL);
	struct ibv_dm *dm;
	CHECK(dm = ibv_alloc_dm(b.ctx, &attr));
	CHECK(dm->context == b.ctx);

	/* Copies. */
	CHECK(ibv_memcpy_to_dm(dm, 0, "word", 4) == 0);
	char back[8] = { 0 };
	CHECK(ibv_memcpy_from_dm(back, dm, 0, 4) == 0 && memcmp(back, "word", 4) == 0);
	CHECK(ibv_memcpy_to_dm(dm, 4092, "12345678", 8) == EFAULT);
	CHECK(ibv_memcpy_to_dm(dm, 2, "1234", 4) == EINVAL);
	CHECK(ibv_memcpy_from_dm(back, dm, 0, 6) == EINVAL);

	/* A zero-based MR over bytes 1024..2047, written and read by the peer. */
	errno = 0;
	CHECK(ibv_reg_dm_mr(b.pd, dm, 0, 64, ALL_ACCESS) == NULL && errno == EINVAL);
	errno = 0;
	CHECK(ibv_reg_dm_mr(b.pd, dm, 4000, 128, DM_ACCESS) == NULL && errno == EINVAL);
	/* Length 0 only has its bounds checked, as the kernel and mlx5 (unlike ibv_reg_mr). */
	{
		struct ibv_mr *empty = ibv_reg_dm_mr(b.pd, dm, 4096, 0, DM_ACCESS);

		CHECK(empty && empty->length == 0 && ibv_dereg_mr(empty) == 0);
		errno = 0;
		CHECK(ibv_reg_dm_mr(b.pd, dm, 4097, 0, DM_ACCESS) == NULL && errno == EINVAL);
		errno = 0;
		CHECK(ibv_reg_mr(b.pd, a.buf, 0, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EINVAL);
	}
	struct ibv_mr *mr;
	CHECK(mr = ibv_reg_dm_mr(b.pd, dm, 1024, 1024, DM_ACCESS));
	CHECK(mr->addr == NULL && mr->length == 1024 && mr->pd == b.pd && mr->rkey != 0);
	strcpy(a.buf, "into device mem!");
	struct ibv_sge s = { .addr = (uintptr_t)a.buf, .length = 16, .lkey = a.mr->lkey };
	struct ibv_send_wr w = { .wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED,
				 .wr.rdma = { .remote_addr = 8, .rkey = mr->rkey } }, *badwr;
	CHECK(ibv_post_send(a.qp, &w, &badwr) == 0);
	struct ibv_wc wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS);
	char got[17] = { 0 };
	CHECK(ibv_memcpy_from_dm(got, dm, 1032, 16) == 0 && strcmp(got, "into device mem!") == 0);
	CHECK(ibv_memcpy_to_dm(dm, 1024 + 512, "readback", 8) == 0);
	s.addr = (uintptr_t)a.buf + 1024;
	s.length = 8;
	w.wr_id = 2;
	w.opcode = IBV_WR_RDMA_READ;
	w.wr.rdma.remote_addr = 512;
	CHECK(ibv_post_send(a.qp, &w, &badwr) == 0);
	wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 2 && wc.status == IBV_WC_SUCCESS && memcmp(a.buf + 1024, "readback", 8) == 0);

	/* Busy while the MR lives. */
	CHECK(ibv_free_dm(dm) == EBUSY);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_free_dm(dm) == 0);
	printf("dm ok\n");
	return 0;
}
