/* bench/checkpoint.c - what a checkpoint costs: dsgd_model_save and
   dsgd_model_restore of the 784-512-512-10 MLP with Adam (669,706
   parameters, three copies: 8.0 MB), against writing the same bytes with
   fwrite + fflush + fsync to a file and reading them back with fread, in
   the same run. Rounds interleave the two, and the medians are reported
   (this machine is noisy). The save's extra work: its checksums, the
   temporary file, the rename and the directory's fsync; the restore's:
   checking the checksums and every size, then writing the buffers.
   Usage: build/bench/checkpoint [ROUNDS] [DIR] (default 15, /tmp). */
#define _POSIX_C_SOURCE 200809L
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"

static int fail(dsgd_ctx *ctx, const char *what) {
    fprintf(stderr, "checkpoint bench: %s: %s\n", what, ctx ? dsgd_ctx_last_error(ctx) : "");
    return 1;
}

int main(int argc, char **argv) {
    static const dsgd_layer_desc layers[3] = {{512, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                              {512, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                              {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    int rounds = argc > 1 ? atoi(argv[1]) : 15, i;
    const char *dir = argc > 2 ? argv[2] : "/tmp";
    char ckpt[512], plain[512];
    dsgd_model_desc md;
    dsgd_optimizer_desc od;
    dsgd_ctx *ctx;
    dsgd_model *m;
    dsgd_optimizer *opt;
    double *ts, *tw, *tr, *tf, s_med, w_med, r_med, f_med;
    unsigned char *img;
    size_t len = 0;
    if (rounds < 1) rounds = 1;
    snprintf(ckpt, sizeof(ckpt), "%s/dsgd_bench_%d.ckpt", dir, (int)getpid());
    snprintf(plain, sizeof(plain), "%s/dsgd_bench_%d.bin", dir, (int)getpid());
    memset(&md, 0, sizeof(md));
    memset(&od, 0, sizeof(od));
    md.input_dim = 784;
    md.layers = layers;
    md.num_layers = 3;
    md.max_batch = 1;
    md.seed = 1;
    od.kind = DSGD_OPT_ADAM;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (dsgd_model_create(ctx, &md, &m) != DSGD_OK || dsgd_optimizer_create(m, &od, &opt) != DSGD_OK)
        return fail(ctx, "model");
    if (dsgd_model_save(m, opt, ckpt, NULL) != DSGD_OK) return fail(ctx, "save");
    if (!(img = (unsigned char *)dsgd__read_file(ctx, ckpt, &len))) return fail(ctx, "read");
    ts = (double *)malloc(sizeof(double) * 4 * (size_t)rounds);
    if (!ts) return 1;
    tw = ts + rounds;
    tr = tw + rounds;
    tf = tr + rounds;
    for (i = 0; i < rounds; ++i) {
        double t0;
        FILE *f;
        t0 = dsgd_now();
        if (dsgd_model_save(m, opt, ckpt, NULL) != DSGD_OK) return fail(ctx, "save");
        ts[i] = dsgd_now() - t0;
        t0 = dsgd_now();
        if (!(f = fopen(plain, "wb")) || fwrite(img, 1, len, f) != len || fflush(f) != 0 || fsync(fileno(f)) != 0)
            return fail(NULL, "fwrite");
        fclose(f);
        tw[i] = dsgd_now() - t0;
        t0 = dsgd_now();
        if (dsgd_model_restore(m, opt, ckpt, NULL) != DSGD_OK) return fail(ctx, "restore");
        tr[i] = dsgd_now() - t0;
        t0 = dsgd_now();
        if (!(f = fopen(plain, "rb")) || fread(img, 1, len, f) != len) return fail(NULL, "fread");
        fclose(f);
        tf[i] = dsgd_now() - t0;
    }
    s_med = bench_median(ts, rounds);
    w_med = bench_median(tw, rounds);
    r_med = bench_median(tr, rounds);
    f_med = bench_median(tf, rounds);
    printf("checkpoint of 784-512-512-10 + Adam: %zu bytes, %d rounds in %s (medians)\n", len, rounds, dir);
    printf("  save     %8.2f ms   fwrite+fsync %8.2f ms   ratio %.2f (target <= 1.2)\n", s_med * 1e3, w_med * 1e3,
           s_med / w_med);
    printf("  restore  %8.2f ms   fread        %8.2f ms   ratio %.2f\n", r_med * 1e3, f_med * 1e3, r_med / f_med);
    unlink(ckpt);
    unlink(plain);
    free(ts);
    free(img);
    dsgd_optimizer_destroy(opt);
    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
    return 0;
}
