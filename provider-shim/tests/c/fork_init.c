/* ibv_fork_init's answers, as libibverbs gives them (the emulator has nothing to prepare):
 * 0 before any memory is registered and ever after; EINVAL once memory was registered
 * first. "early" / "late" as argv[1]; with RDMAV_FORK_SAFE set, the first device list
 * does the early call. */
#include "common.h"

int main(int argc, char **argv)
{
	const char *when = argc > 1 ? argv[1] : "";
	int early = strcmp(when, "early") == 0, env = strcmp(when, "env") == 0;

	if (early)
		CHECK(ibv_fork_init() == 0);
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0]);
	struct ibv_context *c = ibv_open_device(list[0]);
	struct ibv_pd *pd = ibv_alloc_pd(c);
	static char buf[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(c && pd && mr);
	CHECK(ibv_fork_init() == (early || env ? 0 : EINVAL));
	CHECK(ibv_fork_init() == (early || env ? 0 : EINVAL));
	CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED);
	CHECK(ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd) == 0 && ibv_close_device(c) == 0);
	ibv_free_device_list(list);
	printf("fork_init %s ok\n", when);
	return 0;
}
