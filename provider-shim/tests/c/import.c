/* Sharing objects between contexts through the C ABI: ibv_import_device on a dup of a
 * context's cmd_fd, ibv_import_pd / ibv_import_mr / ibv_import_dm by handle, the imported
 * objects used for real traffic, ibv_unimport_* leaving the objects alive, and the errors for
 * foreign fds and stale handles. The rxe profile refuses the whole family with EOPNOTSUPP, as
 * rxe's provider has none of its operations. Prints "import ok". */
#include <fcntl.h>
#include <unistd.h>

#include "common.h"

int main(void)
{
	struct side peer = { 0 };
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	const char *profile = getenv("RDMA_EMU_PROFILE");
	int full = !(profile && strcmp(profile, "rxe") == 0);

	CHECK(list && n >= 2);
	struct ibv_context *c1;
	CHECK(c1 = ibv_open_device(list[0]));
	struct ibv_pd *pd1;
	CHECK(pd1 = ibv_alloc_pd(c1));
	char *buf = aligned_alloc(4096, BUF);
	CHECK(buf);
	strcpy(buf, "registered in context one");
	struct ibv_mr *mr1;
	CHECK(mr1 = ibv_reg_mr(pd1, buf, BUF, ALL_ACCESS));

	/* A second context over the same objects. */
	CHECK(c1->cmd_fd >= 0);
	errno = 0;
	CHECK(ibv_import_device(-1) == NULL && errno == EINVAL);
	/* A character device of no RDMA device: ENODEV, as libibverbs. */
	int devnull = open("/dev/null", O_RDWR);
	errno = 0;
	CHECK(ibv_import_device(devnull) == NULL && errno == ENODEV);
	close(devnull);
	int fd2 = dup(c1->cmd_fd);
	if (!full) {
		errno = 0;
		CHECK(ibv_import_device(fd2) == NULL && errno == EOPNOTSUPP);
		errno = 0;
		CHECK(ibv_import_pd(c1, pd1->handle) == NULL && errno == EOPNOTSUPP);
		errno = 0;
		CHECK(ibv_import_mr(pd1, mr1->handle) == NULL && errno == EOPNOTSUPP);
		errno = 0;
		CHECK(ibv_import_dm(c1, 1) == NULL && errno == EOPNOTSUPP);
		close(fd2);
		CHECK(ibv_dereg_mr(mr1) == 0 && ibv_dealloc_pd(pd1) == 0);
		CHECK(ibv_close_device(c1) == 0);
		ibv_free_device_list(list);
		free(buf);
		puts("import ok");
		return 0;
	}
	struct ibv_context *c2;
	CHECK(c2 = ibv_import_device(fd2));
	CHECK(c2 != c1 && c2->device == c1->device && c2->cmd_fd == fd2);

	struct ibv_pd *pd2;
	CHECK(pd2 = ibv_import_pd(c2, pd1->handle));
	CHECK(pd2 != pd1 && pd2->context == c2 && pd2->handle == pd1->handle);
	errno = 0;
	CHECK(ibv_import_pd(c2, pd1->handle + 1000) == NULL && errno == EINVAL);
	struct ibv_mr *mr2;
	CHECK(mr2 = ibv_import_mr(pd2, mr1->handle));
	CHECK(mr2->addr == mr1->addr && mr2->length == mr1->length && mr2->pd == pd2);
	CHECK(mr2->lkey == mr1->lkey && mr2->rkey == mr1->rkey && mr2->handle == mr1->handle);
	errno = 0;
	CHECK(ibv_import_mr(pd2, pd1->handle) == NULL && errno == EINVAL);

	/* A QP of the imported context, in the imported PD, sends from the imported MR. */
	struct side me = { .ctx = c2, .pd = pd2, .mr = mr2, .buf = buf };
	CHECK(ibv_query_port(c2, 1, &me.port) == 0 && ibv_query_gid(c2, 1, 0, &me.gid) == 0);
	CHECK(me.cq = ibv_create_cq(c2, 16, NULL, NULL, 0));
	struct ibv_qp_init_attr qa = {
		.send_cq = me.cq, .recv_cq = me.cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	CHECK(me.qp = ibv_create_qp(pd2, &qa));
	setup(&peer, list[1]);
	connect_to(&me, &peer);
	connect_to(&peer, &me);
	struct ibv_sge rs = { .addr = (uintptr_t)peer.buf, .length = 64, .lkey = peer.mr->lkey };
	struct ibv_recv_wr r = { .wr_id = 5, .sg_list = &rs, .num_sge = 1 }, *badr;
	CHECK(ibv_post_recv(peer.qp, &r, &badr) == 0);
	struct ibv_sge ss = { .addr = (uintptr_t)buf, .length = 26, .lkey = mr2->lkey };
	struct ibv_send_wr s = { .wr_id = 6, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED }, *bads;
	CHECK(ibv_post_send(me.qp, &s, &bads) == 0);
	CHECK(wait_wc(me.cq).status == IBV_WC_SUCCESS);
	CHECK(wait_wc(peer.cq).wr_id == 5 && strcmp(peer.buf, "registered in context one") == 0);
	/* The PD is one object: busy through either struct while the QP uses it. */
	CHECK(ibv_dealloc_pd(pd1) == EBUSY);
	CHECK(ibv_destroy_qp(me.qp) == 0 && ibv_destroy_cq(me.cq) == 0);

	if (full) {
		struct ibv_alloc_dm_attr da = { .length = 64 };
		struct ibv_dm *dm1, *dm2;
		CHECK(dm1 = ibv_alloc_dm(c1, &da));
		CHECK(dm2 = ibv_import_dm(c2, dm1->handle));
		CHECK(dm2->context == c2 && dm2->handle == dm1->handle);
		CHECK(ibv_memcpy_to_dm(dm1, 0, "shared!!", 8) == 0);
		char got[9] = { 0 };
		CHECK(ibv_memcpy_from_dm(got, dm2, 0, 8) == 0 && strcmp(got, "shared!!") == 0);
		ibv_unimport_dm(dm2);
		uint32_t dm_handle = dm1->handle; /* dm1 is gone after the free */
		CHECK(ibv_free_dm(dm1) == 0);
		errno = 0;
		CHECK(ibv_import_dm(c2, dm_handle) == NULL && errno == EINVAL);
	}

	/* Unimporting frees the structs only; the objects go with their owner's destroy. */
	uint32_t pd_handle = pd1->handle;
	ibv_unimport_mr(mr2);
	ibv_unimport_pd(pd2);
	CHECK(ibv_dereg_mr(mr1) == 0);
	CHECK(ibv_dealloc_pd(pd1) == 0);
	errno = 0;
	CHECK(ibv_import_pd(c2, pd_handle) == NULL && errno == EINVAL);

	/* Closing the imported context closes the fd it was given. */
	CHECK(ibv_close_device(c2) == 0);
	CHECK(fcntl(fd2, F_GETFD) == -1 && errno == EBADF);
	CHECK(ibv_close_device(c1) == 0);
	printf("import ok\n");
	return 0;
}
