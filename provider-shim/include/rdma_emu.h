/* rdma-emu's control functions, exported by its libibverbs.so.1 under the version node
 * RDMA_EMU_1.0 (next to rdma-core's own nodes, which stay exactly as rdma-core 44 has them).
 *
 * They let a test provoke what no traffic can: port and device events, and faults. Programs
 * that also run on real hardware should look them up with
 * dlsym(RTLD_DEFAULT, "rdma_emu_set_port_state"), which finds nothing there. Those returning
 * int return 0 or an errno value unless said otherwise. */
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

/* Replaces the fault rules of the emulated fabric the context's device is on (NULL or ""
 * clears them); the rule language is that of RDMA_EMU_FAULTS (docs/faults.md), e.g.
 * "drop:op=write,nth=1; rnr:count=3". EINVAL, with the reason on stderr, if malformed. */
int rdma_emu_set_faults(struct ibv_context *context, const char *rules);

/* Copies into hits[0..n) how many times each of the current rules has hit, in order;
 * returns the number of rules (-1 for a NULL context). */
int rdma_emu_fault_hits(struct ibv_context *context, uint64_t *hits, int n);

/* The seed of every random choice of the fabric (RDMA_EMU_SEED, or drawn from the clock). */
uint64_t rdma_emu_seed(struct ibv_context *context);

#ifdef __cplusplus
}
#endif

#endif
