/* The receiving side of the wire check (docs/wire.md): a UD QP on rxe0 whose port has the
 * IPv4 address given, with a receive posted; prints its QPN, then what arrives within 10 s.
 *
 *   rxe_receive 10.0.4.1      ->  "qpn N" ... "wc status S byte_len L src_qp Q payload TEXT" */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(c)                                                                      \
	do {                                                                          \
		if (!(c)) {                                                           \
			fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #c); \
			exit(1);                                                      \
		}                                                                     \
	} while (0)

int main(int argc, char **argv)
{
	struct in_addr want;
	CHECK(argc == 2 && inet_pton(AF_INET, argv[1], &want) == 1);
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx);
	int gid_index = -1;
	for (int i = 0; i < 16 && gid_index < 0; i++) {
		struct ibv_gid_entry e;
		if (ibv_query_gid_ex(ctx, 1, i, &e, 0))
			continue;
		if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && memcmp(e.gid.raw + 12, &want, 4) == 0)
			gid_index = i;
	}
	CHECK(gid_index >= 0);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	static char buf[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				       .cap = { 1, 4, 1, 1, 0 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK(pd && cq && mr && qp);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111 };
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY));
	a.qp_state = IBV_QPS_RTR;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE));
	a.qp_state = IBV_QPS_RTS;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN));
	struct ibv_sge sge = { (uintptr_t)buf, sizeof buf, mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(!ibv_post_recv(qp, &rw, &bad));
	printf("qpn %u gid_index %d\n", qp->qp_num, gid_index);
	fflush(stdout);
	time_t end = time(NULL) + 10;
	struct ibv_wc wc;
	while (time(NULL) < end) {
		if (ibv_poll_cq(cq, 1, &wc) == 1) {
			printf("wc status %d byte_len %u src_qp %#x payload %.*s\n", wc.status,
			       wc.byte_len, wc.src_qp, (int)wc.byte_len - 40, buf + 40);
			return wc.status == IBV_WC_SUCCESS ? 0 : 1;
		}
	}
	printf("nothing arrived\n");
	return 1;
}
