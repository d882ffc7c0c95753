/* Prints every pure helper's result over its whole input range; the test runs it on the real
 * rdma-core library and on the shim and requires identical output. */
#include <infiniband/verbs.h>
#include <infiniband/sa.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>
#include <stdio.h>
#include <string.h>

/* libibverbs' <infiniband/marshall.h>, which Debian does not install. */
void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src);
void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src);
void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src);
void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src);

/* Every source byte distinct (seeded), every destination byte 0xa5 beforehand: the dump shows
 * which bytes each conversion writes and with what. */
static void fill(void *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		((unsigned char *)p)[i] = (unsigned char)(i * 7 + seed);
}

static void dump(const char *what, unsigned seed, const void *p, size_t n)
{
	printf("%s %u:", what, seed);
	for (size_t i = 0; i < n; i++)
		printf(" %02x", ((const unsigned char *)p)[i]);
	printf("\n");
}

#define CONVERT(fn, dst_t, src_t)                                  \
	for (unsigned seed = 1; seed < 4; seed++) {                \
		dst_t dst;                                         \
		src_t src;                                         \
		memset(&dst, 0xa5, sizeof(dst));                   \
		fill(&src, sizeof(src), seed * 61);                \
		fn(&dst, &src);                                    \
		dump(#fn, seed, &dst, sizeof(dst));                \
	}

int main(void)
{
	for (int i = -2; i < 30; i++)
		printf("wc %d %s\n", i, ibv_wc_status_str((enum ibv_wc_status)i));
	for (int i = -2; i < 24; i++)
		printf("ev %d %s\n", i, ibv_event_type_str((enum ibv_event_type)i));
	for (int i = -2; i < 10; i++)
		printf("node %d %s\n", i, ibv_node_type_str((enum ibv_node_type)i));
	for (int i = -2; i < 8; i++)
		printf("port %d %s\n", i, ibv_port_state_str((enum ibv_port_state)i));
	for (int i = -2; i < 30; i++)
		printf("rate %d mult %d mbps %d\n", i, ibv_rate_to_mult((enum ibv_rate)i),
		       ibv_rate_to_mbps((enum ibv_rate)i));
	for (int m = -1; m < 500; m++)
		printf("mult %d -> %d\n", m, mult_to_ibv_rate(m));
	int mbps[] = { -1, 0, 2500, 5000, 10000, 14062, 14000, 25781, 28125, 53125, 56250, 103125, 1275000, 9 };
	for (unsigned i = 0; i < sizeof(mbps) / sizeof(mbps[0]); i++)
		printf("mbps %d -> %d\n", mbps[i], mbps_to_ibv_rate(mbps[i]));
	CONVERT(ibv_copy_ah_attr_from_kern, struct ibv_ah_attr, struct ib_uverbs_ah_attr);
	CONVERT(ibv_copy_qp_attr_from_kern, struct ibv_qp_attr, struct ib_uverbs_qp_attr);
	CONVERT(ibv_copy_path_rec_from_kern, struct ibv_sa_path_rec, struct ib_user_path_rec);
	CONVERT(ibv_copy_path_rec_to_kern, struct ib_user_path_rec, struct ibv_sa_path_rec);
	return 0;
}
