/* A test program for cachegrind.out golden files: loops with different
 * memory behaviour, a branchy function, an inlined header function. */
#include <stdio.h>
#include <stdlib.h>
#include "matrix.h"

#define N 64

static long grid[N][N];

__attribute__((noinline)) static void fill(int seed)
{
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            grid[i][j] = (i * 31 + j * 17 + seed) % 101;
}

/* Walks the grid column by column: poor locality. */
__attribute__((noinline)) static long column_sum(void)
{
    long s = 0;
    for (int j = 0; j < N; j++)
        for (int i = 0; i < N; i++)
            s += grid[i][j];
    return s;
}

/* Data-dependent branches. */
__attribute__((noinline)) static int classify(long v)
{
    if (v % 3 == 0)
        return 0;
    else if (v % 5 == 0)
        return 1;
    return 2;
}

__attribute__((noinline)) static long products(void)
{
    long s = 0;
    for (int i = 0; i + 1 < N; i++)
        s += dot(grid[i], grid[i + 1], N);
    return s;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 2;
    int counts[3] = {0, 0, 0};
    long total = 0;
    for (int r = 0; r < rounds; r++) {
        fill(r);
        total += column_sum();
        for (int i = 0; i < N; i++)
            counts[classify(grid[i][i] + r)]++;
        total += products();
    }
    printf("%ld %d %d %d\n", total, counts[0], counts[1], counts[2]);
    return 0;
}
