/* Memory registration as the kernel and the providers answer it: pinning (EFAULT), the full
 * profile's rkey (mlx5: rkey = lkey), and ibv_rereg_mr's errors as libibverbs maps them. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/udmabuf.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"

static int rxe;

/* One-word `op` (a WRITE from, or a READ or FETCH_AND_ADD into, a's buffer) at (addr, rkey)
 * on b's side; the completion's status. After an error both QPs are in ERR (rxe and mlx5 fail
 * the responder too): they are connected again. */
static enum ibv_wc_status one_word(struct side *a, struct side *b, enum ibv_wr_opcode op,
				   uint64_t addr, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)a->buf, .length = 8, .lkey = a->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;
	struct ibv_wc wc;

	wr.wr.rdma.remote_addr = addr;
	wr.wr.rdma.rkey = rkey;
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = addr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = 1;
	}
	CHECK(ibv_post_send(a->qp, &wr, &bad) == 0);
	wc = wait_wc(a->cq);
	if (wc.status != IBV_WC_SUCCESS) {
		struct ibv_qp_attr attr = { .qp_state = IBV_QPS_RESET };
		CHECK(ibv_modify_qp(a->qp, &attr, IBV_QP_STATE) == 0);
		CHECK(ibv_modify_qp(b->qp, &attr, IBV_QP_STATE) == 0);
		connect_to(a, b);
		connect_to(b, a);
	}
	return wc.status;
}

static enum ibv_wc_status write_word(struct side *a, struct side *b, uint64_t addr, uint32_t rkey)
{
	return one_word(a, b, IBV_WR_RDMA_WRITE, addr, rkey);
}

static void pinning(struct side *a)
{
	long page = sysconf(_SC_PAGESIZE);
	char *p = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct ibv_mr *mr;

	CHECK(p != MAP_FAILED);
	/* A wild address, and a range reaching into unmapped memory. */
	CHECK(!ibv_reg_mr(a->pd, (void *)0x10, 64, IBV_ACCESS_LOCAL_WRITE) && errno == EFAULT);
	CHECK(munmap(p + page, page) == 0);
	CHECK(!ibv_reg_mr(a->pd, p, 2 * page, IBV_ACCESS_LOCAL_WRITE) && errno == EFAULT);
	/* Read-only memory: fine for reading, EFAULT with any right that writes. */
	CHECK(mprotect(p, page, PROT_READ) == 0);
	CHECK(!ibv_reg_mr(a->pd, p, page, IBV_ACCESS_LOCAL_WRITE) && errno == EFAULT);
	CHECK(!ibv_reg_mr(a->pd, p, page, ALL_ACCESS) && errno == EFAULT);
	CHECK(mr = ibv_reg_mr(a->pd, p, page, IBV_ACCESS_REMOTE_READ));
	CHECK(ibv_dereg_mr(mr) == 0);
	/* Access flags are checked before the pages (EINVAL, not EFAULT). */
	CHECK(!ibv_reg_mr(a->pd, (void *)0x10, 64, IBV_ACCESS_REMOTE_WRITE) && errno == EINVAL);
	CHECK(munmap(p, page) == 0);
}

static void rereg(struct side *a, struct side *b)
{
	char *mem = aligned_alloc(4096, 2 * BUF);
	struct ibv_mr *mr;
	uint32_t lkey, rkey;

	CHECK(mem);
	memset(mem, 0, 2 * BUF);
	/* A local-only MR: rxe gives it no rkey, mlx5 (the full profile) its lkey. */
	CHECK(mr = ibv_reg_mr(b->pd, mem, BUF, IBV_ACCESS_LOCAL_WRITE));
	CHECK(mr->rkey == (rxe ? 0 : mr->lkey));
	lkey = mr->lkey;
	rkey = mr->lkey; /* what a program written for mlx5 saves */

	/* What libibverbs itself refuses: ERR_INPUT, EINVAL, whatever the provider. */
	CHECK(ibv_rereg_mr(mr, 8, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT && errno == EINVAL);
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, BUF, 0) ==
		      IBV_REREG_MR_ERR_INPUT && errno == EINVAL);
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, mem, 0, 0) ==
		      IBV_REREG_MR_ERR_INPUT && errno == EINVAL);
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, b->pd, NULL, 0, IBV_ACCESS_LOCAL_WRITE) ==
		      IBV_REREG_MR_ERR_INPUT && errno == EINVAL);

	if (rxe) {
		/* rxe has no rereg: libibverbs maps the provider's refusal to ERR_CMD. */
		errno = 0;
		CHECK(ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_CMD &&
		      errno == EOPNOTSUPP);
		CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, ALL_ACCESS) ==
			      IBV_REREG_MR_ERR_CMD && errno == EOPNOTSUPP);
		CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, NULL, NULL, 0, 0) ==
			      IBV_REREG_MR_ERR_CMD && errno == EOPNOTSUPP);
		CHECK(ibv_dereg_mr(mr) == 0);
		free(mem);
		return;
	}
	/* flags == 0 reaches the kernel, which refuses it. */
	CHECK(ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_CMD && errno == EINVAL);
	/* A stale rkey fails until rereg grants the right; then the saved one works. */
	CHECK(write_word(a, b, (uintptr_t)mem, rkey) == IBV_WC_REM_ACCESS_ERR);
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, ALL_ACCESS) == 0);
	CHECK(mr->lkey == lkey && mr->rkey == rkey);
	memcpy(a->buf, "8 bytes", 8);
	CHECK(write_word(a, b, (uintptr_t)mem + 8, rkey) == IBV_WC_SUCCESS);
	CHECK(memcmp(mem + 8, "8 bytes", 8) == 0);
	/* A new translation: the second half of the buffer, same keys, old range gone. */
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, mem + BUF, BUF, 0) == 0);
	CHECK(mr->addr == mem + BUF && mr->length == BUF && mr->lkey == lkey && mr->rkey == rkey);
	CHECK(write_word(a, b, (uintptr_t)mem + BUF, rkey) == IBV_WC_SUCCESS);
	CHECK(memcmp(mem + BUF, "8 bytes", 8) == 0);
	CHECK(write_word(a, b, (uintptr_t)mem + 16, rkey) == IBV_WC_REM_ACCESS_ERR);
	/* A new translation onto memory that cannot be pinned: the provider's EFAULT. */
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, (void *)0x10, 64, 0) ==
		      IBV_REREG_MR_ERR_CMD && errno == EFAULT);
	CHECK(mr->addr == mem + BUF);
	/* A destroyed PD: the kernel finds no PD under the handle. */
	{
		struct ibv_pd *gone = ibv_alloc_pd(b->ctx);
		CHECK(gone && ibv_dealloc_pd(gone) == 0);
		CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, gone, NULL, 0, 0) ==
			      IBV_REREG_MR_ERR_CMD && errno == EINVAL);
	}
	CHECK(ibv_dereg_mr(mr) == 0);
	free(mem);
}

/* IBV_ACCESS_ZERO_BASED: mlx5 (the full profile) counts the MR's addresses from 0; rxe
 * ignores the flag and keeps the virtual address. */
static void zero_based(struct side *a, struct side *b)
{
	char *mem = aligned_alloc(4096, BUF);
	struct ibv_mr *mr;

	CHECK(mem);
	memset(mem, 0, BUF);
	CHECK(mr = ibv_reg_mr(b->pd, mem, BUF, ALL_ACCESS | IBV_ACCESS_ZERO_BASED));
	CHECK(mr->addr == mem);
	memcpy(a->buf, "zerobase", 8);
	CHECK(write_word(a, b, rxe ? (uintptr_t)mem + 24 : 24, mr->rkey) == IBV_WC_SUCCESS);
	CHECK(memcmp(mem + 24, "zerobase", 8) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	free(mem);
}

static void device_memory(struct side *a)
{
	struct ibv_alloc_dm_attr attr = { .length = 64 };
	struct ibv_dm *dm = ibv_alloc_dm(a->ctx, &attr);
	struct ibv_mr *mr;

	if (rxe) {
		CHECK(!dm);
		return;
	}
	CHECK(dm);
	CHECK(mr = ibv_reg_dm_mr(a->pd, dm, 0, 64, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE));
	/* Only registered memory can be re-registered (libibverbs checks the MR's type). */
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, ALL_ACCESS) ==
		      IBV_REREG_MR_ERR_INPUT && errno == EINVAL);
	CHECK(ibv_dereg_mr(mr) == 0 && ibv_free_dm(dm) == 0);
}

/* ibv_reg_dmabuf_mr over a memfd (as over a dma-buf the process can map): what a peer writes
 * lands in the file; the kernel's checks; rxe (Linux 6.1) registers no dma-buf memory. */
static void dmabuf(struct side *a, struct side *b)
{
	int fd = memfd_create("rdma-emu-dmabuf", MFD_CLOEXEC);
	struct ibv_mr *mr;
	char word[8];

	CHECK(fd >= 0 && ftruncate(fd, 3 * 4096) == 0);
	mr = ibv_reg_dmabuf_mr(b->pd, 4096 + 100, 1000, 0x7000 + 100, fd, ALL_ACCESS);
	if (rxe) {
		CHECK(!mr && errno == EOPNOTSUPP);
		/* Refused before the descriptor is looked at (rdma-core 44's rxe has no such op). */
		errno = 0;
		CHECK(!ibv_reg_dmabuf_mr(b->pd, 0, 4096, 0, -1, ALL_ACCESS) && errno == EOPNOTSUPP);
		close(fd);
		return;
	}
	CHECK(mr && mr->addr == (void *)(4096 + 100) && mr->length == 1000 && mr->pd == b->pd);
	memcpy(a->buf, "dma-buf!", 8);
	CHECK(write_word(a, b, 0x7000 + 100 + 16, mr->rkey) == IBV_WC_SUCCESS);
	CHECK(pread(fd, word, 8, 4096 + 100 + 16) == 8 && memcmp(word, "dma-buf!", 8) == 0);
	/* Past the MR's 1000 bytes (the file goes on): REM_ACCESS_ERR. */
	CHECK(write_word(a, b, 0x7000 + 100 + 996, mr->rkey) == IBV_WC_REM_ACCESS_ERR);
	/* libibverbs re-registers only ordinary MRs. */
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE) ==
		      IBV_REREG_MR_ERR_INPUT && errno == EINVAL);
	CHECK(ibv_dereg_mr(mr) == 0);

	/* The kernel's refusals: offset and iova in different places of a page, a range past the
	 * end of the file, zero length, remote write without local write, a descriptor that is not
	 * open, one that cannot be mapped (a pipe: no dma-buf either). */
	errno = 0;
	CHECK(!ibv_reg_dmabuf_mr(b->pd, 100, 8, 200, fd, ALL_ACCESS) && errno == EINVAL);
	errno = 0;
	CHECK(!ibv_reg_dmabuf_mr(b->pd, 2 * 4096, 4097, 2 * 4096, fd, ALL_ACCESS) && errno == EINVAL);
	errno = 0;
	CHECK(!ibv_reg_dmabuf_mr(b->pd, 0, 0, 0, fd, ALL_ACCESS) && errno == EINVAL);
	errno = 0;
	CHECK(!ibv_reg_dmabuf_mr(b->pd, 0, 8, 0, fd, IBV_ACCESS_REMOTE_WRITE) && errno == EINVAL);
	errno = 0;
	CHECK(!ibv_reg_dmabuf_mr(b->pd, 0, 8, 0, 999, ALL_ACCESS) && errno == EBADF);
	int p[2];
	CHECK(pipe(p) == 0);
	errno = 0;
	CHECK(!ibv_reg_dmabuf_mr(b->pd, 0, 8, 0, p[0], ALL_ACCESS) && errno == EINVAL);
	close(p[0]);
	close(p[1]);
	/* The MR keeps its own mapping: closing the descriptor first is fine, as with a dma-buf. */
	CHECK(mr = ibv_reg_dmabuf_mr(b->pd, 0, 4096, 0, fd, ALL_ACCESS));
	close(fd);
	memcpy(a->buf, "closed!!", 8);
	CHECK(write_word(a, b, 8, mr->rkey) == IBV_WC_SUCCESS);
	CHECK(ibv_dereg_mr(mr) == 0);

	/* A real dma-buf where the host offers one (udmabuf over a sealed memfd). */
	int dev = open("/dev/udmabuf", O_RDWR);
	if (dev >= 0) {
		int mfd = memfd_create("rdma-emu-udmabuf", MFD_ALLOW_SEALING);
		CHECK(mfd >= 0 && ftruncate(mfd, 4096) == 0 && fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
		struct udmabuf_create create = { .memfd = mfd, .offset = 0, .size = 4096 };
		int buf = ioctl(dev, UDMABUF_CREATE, &create);
		CHECK(buf >= 0);
		CHECK(mr = ibv_reg_dmabuf_mr(b->pd, 0, 4096, 0, buf, ALL_ACCESS));
		memcpy(a->buf, "udmabuf!", 8);
		CHECK(write_word(a, b, 64, mr->rkey) == IBV_WC_SUCCESS);
		CHECK(pread(mfd, word, 8, 64) == 8 && memcmp(word, "udmabuf!", 8) == 0);
		CHECK(ibv_dereg_mr(mr) == 0);
		close(buf);
		close(mfd);
		close(dev);
	}
}

/* Memory that goes away under a live MR (the application's error: unmapped, or the file
 * under a dma-buf MR truncated). A NIC still reaches the pinned pages; the emulator cannot,
 * and fails each access as an on-demand paging fault that cannot be served, instead of
 * ending the process with SIGSEGV or SIGBUS: a peer's WRITE, READ or atomic gets
 * REM_ACCESS_ERR, and the MR is deregistered as usual. */
static void gone_after_registration(struct side *a, struct side *b)
{
	/* Two pages inside a reservation that nothing else can be mapped into; replacing them
	 * with inaccessible ones unmaps the pages the MR was registered over. */
	char *resv = mmap(NULL, 4 * 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(resv != MAP_FAILED);
	char *mem = resv + 4096;
	CHECK(mmap(mem, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
		   0) == mem);
	struct ibv_mr *mr = ibv_reg_mr(b->pd, mem, 8192, ALL_ACCESS);
	CHECK(mr);
	memcpy(a->buf, "mapped!!", 8);
	CHECK(write_word(a, b, (uintptr_t)mem + 8, mr->rkey) == IBV_WC_SUCCESS);
	CHECK(memcmp(mem + 8, "mapped!!", 8) == 0);
	CHECK(mmap(mem, 8192, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == mem);
	CHECK(write_word(a, b, (uintptr_t)mem + 8, mr->rkey) == IBV_WC_REM_ACCESS_ERR);
	CHECK(one_word(a, b, IBV_WR_RDMA_READ, (uintptr_t)mem + 8, mr->rkey) ==
	      IBV_WC_REM_ACCESS_ERR);
	CHECK(one_word(a, b, IBV_WR_ATOMIC_FETCH_AND_ADD, (uintptr_t)mem + 8, mr->rkey) ==
	      IBV_WC_REM_ACCESS_ERR);
	/* Still connected and working. */
	CHECK(write_word(a, b, (uintptr_t)b->buf, b->mr->rkey) == IBV_WC_SUCCESS);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(munmap(resv, 4 * 4096) == 0);

	if (rxe)
		return; /* no dma-buf MRs on rxe */
	int fd = memfd_create("rdma-emu-truncated", MFD_CLOEXEC);
	CHECK(fd >= 0 && ftruncate(fd, 8192) == 0);
	CHECK(mr = ibv_reg_dmabuf_mr(b->pd, 0, 8192, 0, fd, ALL_ACCESS));
	CHECK(write_word(a, b, 4096, mr->rkey) == IBV_WC_SUCCESS);
	CHECK(ftruncate(fd, 0) == 0);
	CHECK(write_word(a, b, 4096, mr->rkey) == IBV_WC_REM_ACCESS_ERR);
	CHECK(one_word(a, b, IBV_WR_RDMA_READ, 4096, mr->rkey) == IBV_WC_REM_ACCESS_ERR);
	CHECK(ibv_dereg_mr(mr) == 0);
	close(fd);
}

/* On-demand paging (full profile, as mlx5; rxe on 6.1 has none): an MR over memory that is
 * not mapped yet, used once it is; ibv_advise_mr; implicit ODP over the whole address space. */
static void on_demand(struct side *a, struct side *b)
{
	struct ibv_device_attr_ex dx;
	int odp = IBV_ACCESS_ON_DEMAND;
	CHECK(ibv_query_device_ex(b->ctx, NULL, &dx) == 0);
	if (rxe) {
		CHECK(dx.odp_caps.general_caps == 0);
		CHECK(!ibv_reg_mr(b->pd, b->buf, 64, ALL_ACCESS | odp) && errno == EINVAL);
		CHECK(!ibv_reg_mr(b->pd, NULL, SIZE_MAX, ALL_ACCESS | odp) && errno == EINVAL);
		struct ibv_sge sge = { (uintptr_t)b->buf, 8, b->mr->lkey };
		CHECK(ibv_advise_mr(b->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 1) == EOPNOTSUPP);
		return;
	}
	CHECK(dx.odp_caps.general_caps == (IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT));
	CHECK(dx.odp_caps.per_transport_caps.rc_odp_caps == 0x3f && dx.xrc_odp_caps == 0x3f);
	CHECK(dx.odp_caps.per_transport_caps.uc_odp_caps == (IBV_ODP_SUPPORT_SEND |
	      IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE));
	CHECK(dx.odp_caps.per_transport_caps.ud_odp_caps == (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV));

	/* Two pages reserved without access (PROT_NONE: no other mapping can land there), so
	 * nothing is there to pin or touch yet: pinning refuses them, on-demand paging takes them. */
	char *mem = mmap(NULL, 8192, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(mem != MAP_FAILED);
	CHECK(!ibv_reg_mr(b->pd, mem, 8192, ALL_ACCESS) && errno == EFAULT);
	struct ibv_mr *mr = ibv_reg_mr(b->pd, mem, 8192, ALL_ACCESS | odp);
	CHECK(mr);
	memcpy(a->buf, "ondemand", 8);
	/* Nothing there yet: the page fault fails, as on a device. */
	CHECK(write_word(a, b, (uintptr_t)mem + 4096, mr->rkey) == IBV_WC_REM_ACCESS_ERR);
	struct ibv_sge sge = { (uintptr_t)mem, 8192, mr->lkey };
	CHECK(ibv_advise_mr(b->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH,
			    &sge, 1) == EFAULT);
	CHECK(ibv_advise_mr(b->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, IBV_ADVISE_MR_FLAG_FLUSH,
			    &sge, 1) == 0);
	/* Memory mapped there after registration: now it works. */
	CHECK(mmap(mem, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == mem);
	CHECK(ibv_advise_mr(b->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH,
			    &sge, 1) == 0);
	CHECK(write_word(a, b, (uintptr_t)mem + 4096, mr->rkey) == IBV_WC_SUCCESS);
	CHECK(memcmp(mem + 4096, "ondemand", 8) == 0);
	/* ibv_advise_mr's errors: unknown advice, unknown flags, no SGE, a range past the MR, an
	 * lkey of an MR without on-demand paging. */
	CHECK(ibv_advise_mr(b->pd, 7, 0, &sge, 1) == EOPNOTSUPP);
	CHECK(ibv_advise_mr(b->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 2, &sge, 1) == EINVAL);
	CHECK(ibv_advise_mr(b->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 0) == EINVAL);
	struct ibv_sge past = { (uintptr_t)mem + 4096, 8192, mr->lkey };
	CHECK(ibv_advise_mr(b->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &past, 1) == EFAULT);
	struct ibv_sge pinned = { (uintptr_t)b->buf, 8, b->mr->lkey };
	CHECK(ibv_advise_mr(b->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &pinned, 1) == ENOENT);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(munmap(mem, 8192) == 0);

	/* Implicit ODP: one MR whose keys reach every address. */
	CHECK(!ibv_reg_mr(b->pd, NULL, SIZE_MAX, ALL_ACCESS) && errno == EINVAL);
	struct ibv_mr *all = ibv_reg_mr(b->pd, NULL, SIZE_MAX, ALL_ACCESS | odp);
	CHECK(all && all->addr == NULL && all->length == SIZE_MAX);
	char *elsewhere = malloc(64);
	CHECK(elsewhere);
	memcpy(a->buf, "implicit", 8);
	CHECK(write_word(a, b, (uintptr_t)elsewhere + 8, all->rkey) == IBV_WC_SUCCESS);
	CHECK(memcmp(elsewhere + 8, "implicit", 8) == 0);
	CHECK(write_word(a, b, 16, all->rkey) == IBV_WC_REM_ACCESS_ERR); /* the null page */
	CHECK(ibv_dereg_mr(all) == 0);
	free(elsewhere);
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct side a, b;
	const char *profile = getenv("RDMA_EMU_PROFILE");

	rxe = profile && strcmp(profile, "rxe") == 0;
	CHECK(list && list[0] && list[1]);
	setup_pair(list, &a, &b);
	pinning(&a);
	rereg(&a, &b);
	zero_based(&a, &b);
	device_memory(&a);
	dmabuf(&a, &b);
	on_demand(&a, &b);
	gone_after_registration(&a, &b);
	printf("mr ok\n");
	return 0;
}
