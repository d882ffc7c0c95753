/* An OpenSHMEM program whose every result is checked: 1 MiB put into and got back from the
 * next PE's symmetric heap; a ring of rounds in which each PE puts a block, fences, and puts
 * a flag the next PE waits for, spinning on its memory; remote atomic fetch-adds from every PE
 * onto one counter, then compare-and-swaps of which exactly one wins; a sum reduction.
 * Prints "PE P of N verified" and exits 0 only if everything matched. */
#include <shmem.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(...) do { printf(__VA_ARGS__); shmem_global_exit(1); } while (0)

enum { BIG = 1 << 20, BLOCK = 512, ROUNDS = 200, ADDS = 1000 };

static long p_sync[SHMEM_REDUCE_SYNC_SIZE];
static long p_wrk[SHMEM_REDUCE_MIN_WRKDATA_SIZE];
static long block[BLOCK], flag, counter, winners, value, sum;

static uint8_t pattern(int i, int pe)
{
	return (uint8_t)(i * 7 + pe);
}

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	shmem_init();
	int me = shmem_my_pe(), n = shmem_n_pes(), next = (me + 1) % n, prev = (me + n - 1) % n;
	if (n < 2)
		FAIL("needs two PEs\n");
	for (int i = 0; i < SHMEM_REDUCE_SYNC_SIZE; i++)
		p_sync[i] = SHMEM_SYNC_VALUE;

	/* Put a large buffer into the next PE, get the previous one's back. */
	uint8_t *heap = shmem_malloc(BIG), *local = malloc(BIG), *got = malloc(BIG);
	for (int i = 0; i < BIG; i++)
		local[i] = pattern(i, me);
	memset(heap, 0, BIG);
	shmem_barrier_all();
	shmem_putmem(heap, local, BIG, next);
	shmem_barrier_all();
	for (int i = 0; i < BIG; i++)
		if (heap[i] != pattern(i, prev))
			FAIL("PE %d: put: byte %d is %u\n", me, i, heap[i]);
	shmem_getmem(got, heap, BIG, next);
	for (int i = 0; i < BIG; i++)
		if (got[i] != pattern(i, me))
			FAIL("PE %d: get: byte %d is %u\n", me, i, got[i]);

	/* Rounds of a block then its flag: the fence orders the two puts, so a PE that sees the
	 * flag must see the whole block. */
	long mine[BLOCK];
	for (long r = 1; r <= ROUNDS; r++) {
		for (int i = 0; i < BLOCK; i++)
			mine[i] = r * 1000003 + me * BLOCK + i;
		shmem_long_put(block, mine, BLOCK, next);
		shmem_fence();
		shmem_long_p(&flag, r, next);
		shmem_long_wait_until(&flag, SHMEM_CMP_GE, r);
		for (int i = 0; i < BLOCK; i++)
			if (block[i] != r * 1000003 + prev * BLOCK + i)
				FAIL("PE %d: round %ld: word %d is %ld\n", me, r, i, block[i]);
		/* The block is read: the previous PE may overwrite it. */
		shmem_barrier_all();
	}

	/* Atomics onto PE 0's counter from every PE. */
	for (int i = 0; i < ADDS; i++)
		shmem_long_atomic_fetch_add(&counter, 1, 0);
	shmem_barrier_all();
	if (me == 0 && counter != (long)ADDS * n)
		FAIL("PE 0: counter %ld\n", counter);
	shmem_barrier_all();
	if (shmem_long_atomic_compare_swap(&counter, (long)ADDS * n, -1, 0) == (long)ADDS * n)
		shmem_long_atomic_inc(&winners, 0);
	shmem_barrier_all();
	if (me == 0 && (winners != 1 || counter != -1))
		FAIL("PE 0: %ld winners, counter %ld\n", winners, counter);

	value = me + 1;
	shmem_barrier_all();
	shmem_long_sum_to_all(&sum, &value, 1, 0, 0, n, p_wrk, p_sync);
	if (sum != (long)n * (n + 1) / 2)
		FAIL("PE %d: sum %ld\n", me, sum);

	shmem_barrier_all();
	printf("PE %d of %d verified\n", me, n);
	shmem_free(heap);
	shmem_finalize();
	return 0;
}
