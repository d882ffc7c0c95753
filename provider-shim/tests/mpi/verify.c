/* An MPI program whose every result is checked: a 4 MiB point-to-point message (large enough
 * for a rendezvous protocol), an allreduce, and one-sided put and get through a window.
 * Prints "rank R of N verified" and exits 0 only if everything matched. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define FAIL(...) do { printf(__VA_ARGS__); MPI_Abort(MPI_COMM_WORLD, 1); } while (0)

enum { P2P_INTS = 1 << 20, WIN_INTS = 1024 };

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (size < 2)
		FAIL("needs two ranks\n");

	int *buf = malloc(P2P_INTS * sizeof(int));
	if (rank == 0) {
		for (int i = 0; i < P2P_INTS; i++)
			buf[i] = i * 7 + 1;
		MPI_Send(buf, P2P_INTS, MPI_INT, 1, 5, MPI_COMM_WORLD);
	} else if (rank == 1) {
		MPI_Recv(buf, P2P_INTS, MPI_INT, 0, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		for (int i = 0; i < P2P_INTS; i++)
			if (buf[i] != i * 7 + 1)
				FAIL("point-to-point: word %d is %d\n", i, buf[i]);
	}

	long mine = rank + 1, sum = 0;
	MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	if (sum != (long)size * (size + 1) / 2)
		FAIL("allreduce: %ld\n", sum);

	int *win_mem;
	MPI_Win win;
	MPI_Win_allocate(WIN_INTS * sizeof(int), sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD,
			 &win_mem, &win);
	for (int i = 0; i < WIN_INTS; i++)
		win_mem[i] = -1;
	MPI_Win_fence(0, win);
	int peer = (rank + 1) % size, from = (rank + size - 1) % size;
	static int out[WIN_INTS], back[WIN_INTS];
	for (int i = 0; i < WIN_INTS; i++)
		out[i] = rank * 100000 + i;
	MPI_Put(out, WIN_INTS, MPI_INT, peer, 0, WIN_INTS, MPI_INT, win);
	MPI_Win_fence(0, win);
	for (int i = 0; i < WIN_INTS; i++)
		if (win_mem[i] != from * 100000 + i)
			FAIL("put: word %d is %d\n", i, win_mem[i]);
	MPI_Get(back, WIN_INTS, MPI_INT, peer, 0, WIN_INTS, MPI_INT, win);
	MPI_Win_fence(0, win);
	for (int i = 0; i < WIN_INTS; i++)
		if (back[i] != rank * 100000 + i)
			FAIL("get: word %d is %d\n", i, back[i]);
	MPI_Win_free(&win);
	free(buf);

	printf("rank %d of %d verified\n", rank, size);
	/* Out before MPI_Finalize, so that a rank stuck in it has said what it verified. */
	fflush(stdout);
	MPI_Finalize();
	return 0;
}
