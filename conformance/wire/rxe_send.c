/* The sending side of the receive check (docs/wire.md): rxe0's UD QP sends "sent by rxe" to
 * QPN 0x77 (qkey 0x11111111) at the IPv4 address given, from the GID of the local one given.
 *
 *   rxe_send 10.0.4.1 10.0.4.2 */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                      \
	do {                                                                          \
		if (!(c)) {                                                           \
			fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #c); \
			exit(1);                                                      \
		}                                                                     \
	} while (0)

int main(int argc, char **argv)
{
	struct in_addr local, peer;
	CHECK(argc == 3 && inet_pton(AF_INET, argv[1], &local) == 1 &&
	      inet_pton(AF_INET, argv[2], &peer) == 1);
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx);
	int sgid = -1;
	for (int i = 0; i < 16 && sgid < 0; i++) {
		struct ibv_gid_entry e;
		if (!ibv_query_gid_ex(ctx, 1, i, &e, 0) && e.gid_type == IBV_GID_TYPE_ROCE_V2 &&
		    memcmp(e.gid.raw + 12, &local, 4) == 0)
			sgid = i;
	}
	CHECK(sgid >= 0);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	static char buf[64] = "sent by rxe";
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				       .cap = { 4, 1, 1, 1, 0 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK(pd && cq && mr && qp);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111 };
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY));
	a.qp_state = IBV_QPS_RTR;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0x300;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN));
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
				  .grh = { .sgid_index = (uint8_t)sgid, .hop_limit = 64 } };
	aa.grh.dgid.raw[10] = aa.grh.dgid.raw[11] = 0xff;
	memcpy(aa.grh.dgid.raw + 12, &peer, 4);
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(ah);
	struct ibv_sge sge = { (uintptr_t)buf, 11, mr->lkey };
	struct ibv_send_wr w = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED },
			   *bad;
	w.wr.ud.ah = ah;
	w.wr.ud.remote_qpn = 0x77;
	w.wr.ud.remote_qkey = 0x11111111;
	CHECK(!ibv_post_send(qp, &w, &bad));
	struct ibv_wc wc;
	while (ibv_poll_cq(cq, 1, &wc) == 0)
		;
	printf("rxe sent: status %d from qpn %#x\n", wc.status, qp->qp_num);
	return wc.status;
}
