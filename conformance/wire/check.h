/* What the wire tools (rxe_frames.c, rxe_ud.c, rxe_imm.c) share: a check that ends the program
 * saying where and why, the first device opened, and the RoCE v2 GID of an IPv4 address. */
#ifndef RDMA_EMU_WIRE_CHECK_H
#define RDMA_EMU_WIRE_CHECK_H

#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
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

/* The first RDMA device, opened. */
static inline struct ibv_context *open_first_device(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx);
	ibv_free_device_list(list);
	return ctx;
}

/* The index of the RoCE v2 GID of IPv4 address `ip` on port 1 of `ctx`; the GID itself in
 * `*gid` unless NULL. */
static inline int roce_v2_gid_index(struct ibv_context *ctx, const char *ip, union ibv_gid *gid)
{
	/* An IPv6 address is its GID; an IPv4 one is the GID's last four bytes. */
	unsigned char a[16];
	int v6 = inet_pton(AF_INET6, ip, a) == 1;
	CHECK(v6 || inet_pton(AF_INET, ip, a) == 1);
	for (int i = 0; i < 16; i++) {
		struct ibv_gid_entry e;
		if (!ibv_query_gid_ex(ctx, 1, i, &e, 0) && e.gid_type == IBV_GID_TYPE_ROCE_V2 &&
		    (v6 ? memcmp(e.gid.raw, a, 16) == 0 : memcmp(e.gid.raw + 12, a, 4) == 0)) {
			if (gid)
				*gid = e.gid;
			return i;
		}
	}
	CHECK(!"a RoCE v2 GID of that address");
	return -1;
}

#endif
