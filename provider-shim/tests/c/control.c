/* The emulator's control functions (include/rdma_emu.h), looked up with dlsym as a program that
 * also runs on real hardware would: port down/up with PORT_ERR/PORT_ACTIVE on every context of
 * the device, raised port and device events, and EINVAL for events only traffic raises. */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "common.h"
#include "rdma_emu.h"

static void expect_event(struct ibv_context *c, enum ibv_event_type t, int port)
{
	struct ibv_async_event ev;
	CHECK(ibv_get_async_event(c, &ev) == 0);
	CHECK(ev.event_type == t);
	if (port >= 0)
		CHECK(ev.element.port_num == port);
	ibv_ack_async_event(&ev);
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *c1, *c2;
	struct ibv_port_attr pa;
	typeof(rdma_emu_set_port_state) *set_state = dlsym(RTLD_DEFAULT, "rdma_emu_set_port_state");
	typeof(rdma_emu_raise_event) *raise = dlsym(RTLD_DEFAULT, "rdma_emu_raise_event");

	CHECK(list && n >= 1 && set_state && raise);
	CHECK((c1 = ibv_open_device(list[0])) && (c2 = ibv_open_device(list[0])));

	CHECK(set_state(c1, 1, IBV_PORT_DOWN) == 0);
	expect_event(c1, IBV_EVENT_PORT_ERR, 1);
	expect_event(c2, IBV_EVENT_PORT_ERR, 1);
	CHECK(ibv_query_port(c2, 1, &pa) == 0 && pa.state == IBV_PORT_DOWN);
	CHECK(set_state(c1, 1, IBV_PORT_ACTIVE) == 0);
	expect_event(c2, IBV_EVENT_PORT_ACTIVE, 1);
	expect_event(c1, IBV_EVENT_PORT_ACTIVE, 1);
	CHECK(set_state(c1, 1, IBV_PORT_INIT) == EINVAL);
	CHECK(set_state(c1, 9, IBV_PORT_DOWN) == EINVAL);

	CHECK(raise(c1, IBV_EVENT_LID_CHANGE, 1) == 0);
	expect_event(c2, IBV_EVENT_LID_CHANGE, 1);
	expect_event(c1, IBV_EVENT_LID_CHANGE, 1);
	CHECK(raise(c2, IBV_EVENT_DEVICE_FATAL, 0) == 0);
	expect_event(c1, IBV_EVENT_DEVICE_FATAL, -1);
	expect_event(c2, IBV_EVENT_DEVICE_FATAL, -1);
	CHECK(raise(c1, IBV_EVENT_QP_FATAL, 1) == EINVAL);
	CHECK(raise(NULL, IBV_EVENT_SM_CHANGE, 1) == EINVAL);

	CHECK(ibv_close_device(c1) == 0 && ibv_close_device(c2) == 0);
	ibv_free_device_list(list);
	printf("control ok\n");
	return 0;
}
