/* rdma-emu's control functions, exported by its libibverbs.so.1 under the version node
 * RDMA_EMU_1.0 (next to rdma-core's own nodes, which stay exactly as rdma-core 44 has them).
 *
 * They let a test provoke what no traffic can: port and device events. Programs that also run
 * on real hardware should look them up with dlsym(RTLD_DEFAULT, "rdma_emu_set_port_state"),
 * which finds nothing there. Both return 0 or an errno value. */
#ifndef RDMA_EMU_H
#define RDMA_EMU_H

#include <infiniband/verbs.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Takes port `port_num` of the context's device down (IBV_PORT_DOWN) or back up
 * (IBV_PORT_ACTIVE): every open context of the device gets IBV_EVENT_PORT_ERR or
 * IBV_EVENT_PORT_ACTIVE, and while the port is down every packet to or from it is lost. */
int rdma_emu_set_port_state(struct ibv_context *context, uint8_t port_num, enum ibv_port_state state);

/* Raises a port event (IBV_EVENT_LID_CHANGE, PKEY_CHANGE, GID_CHANGE, SM_CHANGE,
 * CLIENT_REREGISTER; element.port_num = port_num) or IBV_EVENT_DEVICE_FATAL on every open
 * context of the context's device. Other event types are raised by traffic and give EINVAL. */
int rdma_emu_raise_event(struct ibv_context *context, enum ibv_event_type event, uint8_t port_num);

#ifdef __cplusplus
}
#endif

#endif
