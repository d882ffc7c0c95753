/* What the wire tools (rxe_frames.c, rxe_ud.c) share: a check that ends the program saying
 * where and why. */
#ifndef RDMA_EMU_WIRE_CHECK_H
#define RDMA_EMU_WIRE_CHECK_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                        \
	do {                                                                            \
		if (!(c)) {                                                             \
			fprintf(stderr, "%s:%d: CHECK(%s) failed: %s\n", __FILE__, __LINE__, \
				#c, strerror(errno));                                   \
			exit(1);                                                        \
		}                                                                       \
	} while (0)

#endif
