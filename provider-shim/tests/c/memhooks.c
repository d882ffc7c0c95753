/* What memory hooks see of registration. libfabric and UCX keep their registration caches
 * true by patching libc's mmap, munmap, mremap and madvise: a call on cached memory means the
 * application changed it, and the cache drops the regions it covers. A NIC changes no mapping
 * to register memory; the emulator reads it in at registration and, on the host fabric, moves
 * its pages into shared memory and back (see emu/src/shared_mem.rs). Told of that through
 * libc from inside its own registration, libfabric's rxm dropped regions it was using and
 * crashed in fi_cq_read. This program defines those functions itself, so every library's
 * calls to them land here, and requires that none touches registered memory while it is
 * registered, used (a WRITE into it, a READ from it) and deregistered, nor across a fork. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "common.h"

static uintptr_t watch_lo, watch_hi;
static int touched;

static void note(const char *call, void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr;

	if (a < __atomic_load_n(&watch_hi, __ATOMIC_RELAXED) &&
	    a + len > __atomic_load_n(&watch_lo, __ATOMIC_RELAXED)) {
		__atomic_add_fetch(&touched, 1, __ATOMIC_RELAXED);
		/* write(2), not stdio: this may run inside malloc. */
		(void)!write(2, call, strlen(call));
		(void)!write(2, " on registered memory\n", 22);
	}
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	if (addr)
		note("mmap", addr, len);
	return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}

int munmap(void *addr, size_t len)
{
	note("munmap", addr, len);
	return syscall(SYS_munmap, addr, len);
}

void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...)
{
	void *at = NULL;

	if (flags & MREMAP_FIXED) {
		va_list ap;
		va_start(ap, flags);
		at = va_arg(ap, void *);
		va_end(ap);
		note("mremap (to)", at, new_len);
	}
	note("mremap", old, old_len);
	return (void *)syscall(SYS_mremap, old, old_len, new_len, flags, at);
}

int madvise(void *addr, size_t len, int advice)
{
	note("madvise", addr, len);
	return syscall(SYS_madvise, addr, len, advice);
}

/* One signaled work request of `op` from a's buffer to (addr, rkey) on b; its status. */
static enum ibv_wc_status one(struct side *a, enum ibv_wr_opcode op, void *local, uint32_t lkey,
			      uint64_t addr, uint32_t rkey, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;

	wr.wr.rdma.remote_addr = addr;
	wr.wr.rdma.rkey = rkey;
	CHECK(ibv_post_send(a->qp, &wr, &bad) == 0);
	return wait_wc(a->cq).status;
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	size_t len = 1 << 20;
	struct side a, b;
	struct ibv_mr *mr, *src_mr;
	unsigned char *src, *buf;
	pid_t child;
	int status;

	CHECK(list && list[0] && list[1]);
	setup_pair(list, &a, &b);
	/* Large enough that the host fabric moves it into shared memory, and so does its source. */
	buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	src = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(buf != MAP_FAILED && src != MAP_FAILED);
	memset(buf, 0x11, len);
	memset(src, 0x5a, len);
	__atomic_store_n(&watch_lo, (uintptr_t)buf, __ATOMIC_RELAXED);
	__atomic_store_n(&watch_hi, (uintptr_t)buf + len, __ATOMIC_RELAXED);

	CHECK(mr = ibv_reg_mr(a.pd, buf, len, ALL_ACCESS));
	CHECK(src_mr = ibv_reg_mr(b.pd, src, len, ALL_ACCESS));
	CHECK(one(&b, IBV_WR_RDMA_WRITE, src, src_mr->lkey, (uintptr_t)buf, mr->rkey, len) ==
	      IBV_WC_SUCCESS);
	CHECK(buf[0] == 0x5a && buf[len - 1] == 0x5a);
	buf[7] = 0x77;
	CHECK(one(&b, IBV_WR_RDMA_READ, src, src_mr->lkey, (uintptr_t)buf, mr->rkey, len) ==
	      IBV_WC_SUCCESS);
	CHECK(src[7] == 0x77 && src[8] == 0x5a);
	/* A fork while it is registered: the child sees its bytes as private memory. */
	child = fork();
	CHECK(child >= 0);
	if (child == 0) {
		buf[9] = 0x99;
		_exit(buf[7] == 0x77 && buf[9] == 0x99 && touched == 0 ? 0 : 1);
	}
	CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) &&
	      WEXITSTATUS(status) == 0);
	CHECK(buf[9] == 0x5a);
	/* Registered again over part of it, then both deregistered. */
	struct ibv_mr *part = ibv_reg_mr(a.pd, buf + 4096, len / 2, IBV_ACCESS_LOCAL_WRITE);
	CHECK(part);
	CHECK(ibv_dereg_mr(part) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(buf[7] == 0x77 && buf[len - 1] == 0x5a);
	CHECK(__atomic_load_n(&touched, __ATOMIC_RELAXED) == 0);

	/* The watch itself works: the application's own call is seen. */
	CHECK(madvise(buf, len, MADV_NORMAL) == 0);
	CHECK(__atomic_load_n(&touched, __ATOMIC_RELAXED) == 1);
	printf("memhooks ok\n");
	return 0;
}
