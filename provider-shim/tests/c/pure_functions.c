/* Prints every pure helper's result over its whole input range; the test runs it on the real
 * rdma-core library and on the shim and requires identical output. */
#include <infiniband/verbs.h>
#include <stdio.h>

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
	return 0;
}
