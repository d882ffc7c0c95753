/* The library registers the process for the kernel's process-wide barrier as it is loaded,
 * while the process most likely has one thread: the kernel registers such a process at once,
 * and one of several threads only after an RCU grace period (~15 ms), which the first QP's
 * creation used to pay in every process. So a barrier asked for before any verb is allowed.
 * Prints "barrier_at_load ok". */
#include "common.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(void)
{
	long supported = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0);
	CHECK(supported >= 0 && (supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED));
	/* Refused with EPERM in a process not registered. */
	CHECK(syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) == 0);

	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0);
	ibv_free_device_list(list);
	printf("barrier_at_load ok\n");
	return 0;
}
