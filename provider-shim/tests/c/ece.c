/* Enhanced Connection Establishment through the C ABI: ibv_query_ece on a new QP reports the
 * device's options, ibv_set_ece's checks (vendor 0, another vendor, comp_mask), the options
 * asked for taken up at the next connecting transition. The rxe profile refuses both, as rxe.
 * Prints "ece ok". */
#include "common.h"

int main(void)
{
	struct side a = { 0 };
	struct ibv_device_attr attr;
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	const char *profile = getenv("RDMA_EMU_PROFILE");

	CHECK(list && n >= 1);
	setup(&a, list[0]);
	CHECK(ibv_query_device(a.ctx, &attr) == 0);
	struct ibv_ece ece = { 0 };
	if (profile && strcmp(profile, "rxe") == 0) {
		CHECK(ibv_query_ece(a.qp, &ece) == EOPNOTSUPP);
		ece.vendor_id = attr.vendor_id;
		CHECK(ibv_set_ece(a.qp, &ece) == EOPNOTSUPP);
		printf("ece ok\n");
		return 0;
	}
	CHECK(ibv_query_ece(a.qp, &ece) == 0);
	CHECK(ece.vendor_id == attr.vendor_id && ece.options == 0x3 && ece.comp_mask == 0);
	struct ibv_ece want = { .vendor_id = 0, .options = 0x5 };
	CHECK(ibv_set_ece(a.qp, &want) == EOPNOTSUPP && errno == EOPNOTSUPP);
	want.vendor_id = 0x02c9;
	CHECK(ibv_set_ece(a.qp, &want) == EINVAL);
	want.vendor_id = attr.vendor_id;
	want.comp_mask = 1;
	CHECK(ibv_set_ece(a.qp, &want) == EINVAL);
	want.comp_mask = 0;
	CHECK(ibv_set_ece(a.qp, &want) == 0);
	CHECK(ibv_query_ece(a.qp, &ece) == 0 && ece.options == 0);
	struct ibv_qp_attr init = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	CHECK(ibv_modify_qp(a.qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						 IBV_QP_ACCESS_FLAGS) == 0);
	CHECK(ibv_query_ece(a.qp, &ece) == 0 && ece.options == 0x1);
	printf("ece ok\n");
	return 0;
}
