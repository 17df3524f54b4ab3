// Memory bandwidth on this machine, the limit that decode runs into.
// Build: cc -O3 -march=native -fopenmp membw.c -o membw ; run: OMP_NUM_THREADS=2 ./membw [MiB]
// Prints one JSON object: best-of-N GB/s (1e9 bytes/s) for a read-only sum (what a
// matrix-vector product over the weights does), a copy (read + write counted) and a write.
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double now(void) { return omp_get_wtime(); }

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 1024;
    size_t n = mib * 1024 * 1024 / sizeof(uint32_t);
    uint32_t *a = aligned_alloc(64, n * sizeof(uint32_t)), *b = aligned_alloc(64, n * sizeof(uint32_t));
    if (!a || !b) { fprintf(stderr, "membw: out of memory\n"); return 1; }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) { a[i] = (uint32_t)i; b[i] = 0; }  // first touch per thread
    double best_read = 0, best_copy = 0, best_write = 0;
    uint32_t sink = 0;
    for (int rep = 0; rep < 8; rep++) {
        double t = now();
        uint32_t s = 0;  // xor: a reduction the compiler vectorizes without -ffast-math
#pragma omp parallel for reduction(^ : s) schedule(static)
        for (size_t i = 0; i < n; i++) s ^= a[i];
        t = now() - t; sink ^= s;
        if (n * sizeof(uint32_t) / t > best_read) best_read = n * sizeof(uint32_t) / t;

        t = now();
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) b[i] = a[i];
        t = now() - t;
        if (2.0 * n * sizeof(uint32_t) / t > best_copy) best_copy = 2.0 * n * sizeof(uint32_t) / t;

        t = now();
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) b[i] = (uint32_t)rep;
        t = now() - t;
        if (n * sizeof(uint32_t) / t > best_write) best_write = n * sizeof(uint32_t) / t;
    }
    printf("{\"threads\": %d, \"mib\": %zu, \"read_gbs\": %.2f, \"copy_gbs\": %.2f, \"write_gbs\": %.2f, \"sink\": %u}\n",
           omp_get_max_threads(), mib, best_read / 1e9, best_copy / 1e9, best_write / 1e9, sink & 1u);
    free(a); free(b);
    return 0;
}
