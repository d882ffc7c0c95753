/* The emulated devices' kernel-facing files agree with the verbs: ibv_get_sysfs_path() names
 * a tree whose class/infiniband/<dev> has the node GUID, node type, ports' state, GIDs, GID
 * types and (RoCE) the netdev of each GID that ibv_query_gid_ex names; a port taken down
 * through the control API shows in its state file; ibv_read_sysfs_file reads it. Under
 * `rdma-emu run` (argv[1] "view") the path is /sys and /dev/infiniband/uverbsN are character
 * devices that read and write. Prints "sysfs ok". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <net/if.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "rdma_emu.h"

const char *ibv_get_sysfs_path(void);
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);

/* The file's first line. */
static void slurp(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "cannot open %s\n", path);
		exit(1);
	}
	CHECK(fgets(buf, (int)size, f));
	buf[strcspn(buf, "\n")] = 0;
	fclose(f);
}

int main(int argc, char **argv)
{
	int n, view = argc > 1 && strcmp(argv[1], "view") == 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	char dir[512], path[700], text[128], want[128];

	CHECK(list && n >= 1);
	const char *root = ibv_get_sysfs_path();
	CHECK(root);
	CHECK(view ? strcmp(root, "/sys") == 0 : strcmp(root, "/sys") != 0);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx);
	snprintf(dir, sizeof dir, "%s/class/infiniband/%s", root, ibv_get_device_name(list[0]));

	uint64_t g = be64toh(ibv_get_device_guid(list[0]));
	snprintf(want, sizeof want, "%04x:%04x:%04x:%04x", (unsigned)(g >> 48) & 0xffff,
		 (unsigned)(g >> 32) & 0xffff, (unsigned)(g >> 16) & 0xffff, (unsigned)g & 0xffff);
	snprintf(path, sizeof path, "%s/node_guid", dir);
	slurp(path, text, sizeof text);
	CHECK(strcmp(text, want) == 0);
	CHECK(ibv_read_sysfs_file(dir, "node_type", text, sizeof text) == 5);
	CHECK(strcmp(text, "1: CA") == 0);
	CHECK(ibv_read_sysfs_file(dir, "no_such_file", text, sizeof text) == -1 && errno == ENOENT);

	struct ibv_port_attr pa;
	CHECK(ibv_query_port(ctx, 1, &pa) == 0);
	snprintf(path, sizeof path, "%s/ports/1/link_layer", dir);
	slurp(path, text, sizeof text);
	int roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
	CHECK(strcmp(text, roce ? "Ethernet" : "InfiniBand") == 0);
	snprintf(path, sizeof path, "%s/ports/1/lid", dir);
	slurp(path, text, sizeof text);
	snprintf(want, sizeof want, "0x%x", pa.lid);
	CHECK(strcmp(text, want) == 0);

	/* Every GID: its text, its type and (RoCE) its netdev, as the verbs say. */
	struct ibv_gid_entry entries[64];
	ssize_t k = ibv_query_gid_table(ctx, entries, 64, 0);
	CHECK(k >= 1);
	for (ssize_t i = 0; i < k; i++) {
		struct ibv_gid_entry *e = &entries[i];
		const uint8_t *r = e->gid.raw;
		snprintf(want, sizeof want,
			 "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x",
			 r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11],
			 r[12], r[13], r[14], r[15]);
		snprintf(path, sizeof path, "%s/ports/1/gids/%u", dir, e->gid_index);
		slurp(path, text, sizeof text);
		CHECK(strcmp(text, want) == 0);
		snprintf(path, sizeof path, "%s/ports/1/gid_attrs/types/%u", dir, e->gid_index);
		slurp(path, text, sizeof text);
		CHECK(strcmp(text, e->gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" : "IB/RoCE v1") == 0);
		if (roce) {
			char name[IF_NAMESIZE];
			CHECK(e->ndev_ifindex != 0 && if_indextoname(e->ndev_ifindex, name));
			snprintf(path, sizeof path, "%s/ports/1/gid_attrs/ndevs/%u", dir, e->gid_index);
			slurp(path, text, sizeof text);
			CHECK(strcmp(text, name) == 0);
		} else {
			CHECK(e->ndev_ifindex == 0);
		}
	}

	/* The port's state follows the control API. */
	snprintf(path, sizeof path, "%s/ports/1/state", dir);
	slurp(path, text, sizeof text);
	CHECK(strcmp(text, "4: ACTIVE") == 0);
	int (*set_port_state)(struct ibv_context *, uint8_t, enum ibv_port_state) =
		dlsym(RTLD_DEFAULT, "rdma_emu_set_port_state");
	CHECK(set_port_state && set_port_state(ctx, 1, IBV_PORT_DOWN) == 0);
	slurp(path, text, sizeof text);
	CHECK(strcmp(text, "1: DOWN") == 0);
	snprintf(path, sizeof path, "%s/ports/1/phys_state", dir);
	slurp(path, text, sizeof text);
	CHECK(strcmp(text, "3: Disabled") == 0);
	CHECK(set_port_state(ctx, 1, IBV_PORT_ACTIVE) == 0);

	snprintf(path, sizeof path, "%s/class/infiniband_verbs/uverbs0/ibdev", root);
	slurp(path, text, sizeof text);
	CHECK(strcmp(text, ibv_get_device_name(list[0])) == 0);
	if (view) {
		struct stat st;
		for (int i = 0; i < n; i++) {
			snprintf(path, sizeof path, "/dev/infiniband/uverbs%d", i);
			CHECK(stat(path, &st) == 0 && S_ISCHR(st.st_mode));
			CHECK(access(path, R_OK | W_OK) == 0);
		}
	}
	CHECK(ibv_close_device(ctx) == 0);
	ibv_free_device_list(list);
	printf("sysfs ok\n");
	return 0;
}
