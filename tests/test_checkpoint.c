/* test_checkpoint.c - checkpoints: resume bit for bit, resume at another
   replica count, crash consistency, corruption, mismatches; CRC32C; the
   sampler's cursor.

   The training model is 20 -> 16 relu -> 8 tanh -> 5 with softmax
   cross-entropy (517 parameters) on 200 samples from the tests' generator,
   drawn by a shuffling sampler in global batches of 24 (9 batches an epoch,
   the last of 8). Every step also runs a replica function that adds to two
   distributed variables (ON_READ SUM and ON_WRITE MEAN), so they, the
   metrics, the optimizer's slots and step, the sampler and a user section
   all travel through the checkpoint.

   What is asserted, and how it is measured:
   - Resume: a child process trains 100 steps and saves; this process
     creates a new strategy, restores, trains 100 more. Parameters of every
     replica, the TRAIN metrics, both variables, the sampler's position and
     the user section equal a run of 200 uninterrupted steps bit for bit
     (a step count or an optimizer slot restored wrong would move the
     parameters: the schedule warms up over 30 steps): SGD, momentum and Adam, mirrored at N = 1 and 4, central
     storage at N = 2; the model-level save/restore likewise.
   - Resume at N = 2 from a 4-replica checkpoint: parameters within 1e-5
     (one global relative error) of the uninterrupted 4-replica run, and
     every epoch, the one cut by the checkpoint included, hands out each
     sample exactly once (counts carried across in the user section).
   - Crash consistency: 200 times a child saves a new state over an old
     checkpoint and is killed with SIGKILL after a random delay within the
     save's duration; the file under the path is then byte for byte the old
     or the new checkpoint, and loads; after the 200 kills no temporary file
     of the path is left (each save removes those of killed writers).
   - Stale temporaries: beside a checkpoint, temporaries of its path named
     for this machine and a process that has exited (a child, reaped) are
     removed by the next save, in another directory and in the current
     one; a temporary of this live process, one named for another machine,
     another path's, near-misses of the name and unrelated files are left
     byte for byte.
   - Corruption: every single-bit flip and every truncation of a small
     checkpoint is DSGD_ERR_FORMAT, and the model, optimizer, sampler and
     user bytes are untouched; another model shape, optimizer kind, sampler
     or user size, a missing part or distributed variable is DSGD_ERR_SHAPE
     naming it.
   - CRC32C: the standard check values, and the SSE4.2 path equal to the
     table at every length and alignment up to 300 bytes.
   That is make test-full. make test (the quick tier) cuts the resumes at
   step 28 of 56 (inside the warm-up), kills 20 saves spread over the
   save's duration, and flips and cuts the small checkpoint at the points
   corruption_points picks (every kind of byte, every boundary).

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant). */
#include "harness.h"

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>

#define IN 20
#define OUT 5
#define NPARAMS 517
#define NSAMPLES 200
#define GBATCH 24
#define MODEL_SEED 20240611u

static dsgd_layer_desc LAYERS[3] = {{16, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                    {8, DSGD_ACT_TANH, DSGD_INIT_AUTO},
                                    {OUT, DSGD_ACT_NONE, DSGD_INIT_AUTO}};

static float g_x[NSAMPLES * IN], g_y[NSAMPLES];
static char g_dir[64];

static int setup(void **state) {
    tu_rng r = tu_rng_make(99);
    int i;
    (void)state;
    tu_fill(&r, g_x, NSAMPLES * IN, -1.0f, 1.0f);
    for (i = 0; i < NSAMPLES; ++i) g_y[i] = (float)tu_below(&r, OUT);
    tu_mkdtemp(g_dir);
    tu_watchdog(300); /* a hang fails the run instead of blocking CI */
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tu_rmdir_files(g_dir);
    tu_watchdog(0);
    return 0;
}

static void path_of(char *out, const char *name) { snprintf(out, 256, "%s/%s", g_dir, name); }

TU_FN int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

static dsgd_optimizer_desc opt_desc(dsgd_optimizer_kind kind) {
    dsgd_optimizer_desc od;
    memset(&od, 0, sizeof(od));
    od.kind = kind;
    od.lr = kind == DSGD_OPT_ADAM ? 0.005f : 0.05f;
    od.schedule.warmup_steps = 30; /* the schedule's position must travel too */
    return od;
}

static dsgd_model_desc model_desc(int max_batch) {
    dsgd_model_desc md;
    memset(&md, 0, sizeof(md));
    md.input_dim = IN;
    md.layers = LAYERS;
    md.num_layers = 3;
    md.max_batch = max_batch;
    md.seed = MODEL_SEED;
    return md;
}

/* ---------------------------------------------------------------- the training run */

/* What the user section carries: its own step counter and, for each
   sample, how often the current epoch has handed it out. */
typedef struct user_state {
    uint64_t steps;
    unsigned char seen[NSAMPLES];
} user_state;

typedef struct run {
    dsgd_ctx *ctx;
    dsgd_strategy *s;
    dsgd_sampler smp;
    user_state u;
    int var_sum, var_mean;
    int epochs_checked;
} run;

static void run_make(run *r, dsgd_strategy_kind kind, int n, dsgd_optimizer_kind opt) {
    dsgd_strategy_desc d;
    dsgd_dvar_desc vd;
    memset(r, 0, sizeof(*r));
    memset(&d, 0, sizeof(d));
    d.kind = kind;
    d.num_replicas = n;
    d.model = model_desc(GBATCH);
    d.optimizer = opt_desc(opt);
    d.timeout_s = 20.0;
    r->ctx = tu_ctx();
    TU_OK(r->ctx, dsgd_strategy_create(r->ctx, &d, &r->s));
    TU_OK(r->ctx, dsgd_sampler_init(r->ctx, &r->smp, NSAMPLES, GBATCH, 7, 1, 0));
    memset(&vd, 0, sizeof(vd));
    vd.name = "user/sum";
    vd.count = 3;
    vd.synchronization = DSGD_SYNC_ON_READ;
    vd.aggregation = DSGD_AGG_SUM;
    TU_OK(r->ctx, dsgd_strategy_create_variable(r->s, &vd, &r->var_sum));
    vd.name = "user/mean";
    vd.count = 2;
    vd.synchronization = DSGD_SYNC_ON_WRITE;
    vd.aggregation = DSGD_AGG_MEAN;
    vd.trainable = 1;
    TU_OK(r->ctx, dsgd_strategy_create_variable(r->s, &vd, &r->var_mean));
}

static void run_free(run *r) {
    dsgd_sampler_free(&r->smp);
    dsgd_strategy_destroy(r->s);
    dsgd_ctx_destroy(r->ctx);
}

static dsgd_result add_to_vars(dsgd_replica *rep, void *user) {
    const run *r = (const run *)user;
    float d3[3], d2[2];
    dsgd_result res;
    d3[0] = (float)(dsgd_replica_id(rep) + 1) * 0.25f;
    d3[1] = 1.0f / (float)(r->u.steps + 3);
    d3[2] = 0.1f;
    d2[0] = 0.5f * (float)dsgd_replica_id(rep);
    d2[1] = 1.0f / 3.0f;
    if ((res = dsgd_replica_assign_add(rep, r->var_sum, d3)) != DSGD_OK) return res;
    return dsgd_replica_assign_add(rep, r->var_mean, d2);
}

/* Trains `steps` steps from the sampler; at each epoch's end checks that
   the epoch handed out every sample exactly once. */
static void run_train(run *r, int steps) {
    static float x[GBATCH * IN], y[GBATCH];
    int done = 0;
    while (done < steps) {
        const size_t *idx;
        size_t k = dsgd_sampler_next(&r->smp, &idx), i;
        if (k == 0) {
            for (i = 0; i < NSAMPLES; ++i)
                if (r->u.seen[i] != 1)
                    fail_msg("epoch %llu handed out sample %zu %d times", (unsigned long long)r->smp.epoch, i,
                             r->u.seen[i]);
            memset(r->u.seen, 0, sizeof(r->u.seen));
            r->epochs_checked++;
            dsgd_sampler_set_epoch(&r->smp, r->smp.epoch + 1);
            continue;
        }
        for (i = 0; i < k; ++i) {
            memcpy(x + i * IN, g_x + idx[i] * IN, IN * sizeof(float));
            y[i] = g_y[idx[i]];
            r->u.seen[idx[i]]++;
        }
        TU_OK(r->ctx, dsgd_strategy_train_step(r->s, x, y, (int)k, NULL));
        TU_OK(r->ctx, dsgd_strategy_run(r->s, add_to_vars, r));
        r->u.steps++;
        done++;
    }
}

static dsgd_checkpoint_extra run_extra(run *r) {
    dsgd_checkpoint_extra x;
    x.sampler = &r->smp;
    x.user = &r->u;
    x.user_bytes = sizeof(r->u);
    return x;
}

/* Everything a resumed run must reproduce. */
typedef struct outcome {
    float params[NPARAMS];
    float sum[3], mean[2];
    dsgd_metrics train;
    int64_t steps;
    uint64_t epoch;
    size_t cursor;
} outcome;

static void run_outcome(run *r, outcome *o) {
    memset(o, 0, sizeof(*o));
    tu_assert_replicas_identical(r->ctx, r->s);
    TU_OK(r->ctx, dsgd_model_get_params(dsgd_strategy_model(r->s, 0), o->params, NPARAMS));
    TU_OK(r->ctx, dsgd_strategy_read_variable(r->s, r->var_sum, o->sum));
    TU_OK(r->ctx, dsgd_strategy_read_variable(r->s, r->var_mean, o->mean));
    TU_OK(r->ctx, dsgd_strategy_take_metrics(r->s, DSGD_METRICS_TRAIN, &o->train));
    o->epoch = r->smp.epoch;
    o->cursor = r->smp.cursor;
}

static void expect_same(const outcome *got, const outcome *want) {
    if (memcmp(got->params, want->params, sizeof(got->params)) != 0)
        fail_msg("resumed parameters differ (relative error %.3g)", tu_rel_err(got->params, want->params, NPARAMS));
    assert_memory_equal(got->sum, want->sum, sizeof(got->sum));
    assert_memory_equal(got->mean, want->mean, sizeof(got->mean));
    assert_memory_equal(&got->train, &want->train, sizeof(got->train));
    assert_int_equal(got->epoch, want->epoch);
    assert_int_equal(got->cursor, want->cursor);
}

/* Trains `first` steps in a child process and saves to path there. */
static void child_train_and_save(dsgd_strategy_kind kind, int n, dsgd_optimizer_kind opt, int first,
                                 const char *path) {
    pid_t pid;
    int status = 0;
    fflush(NULL);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        run r;
        dsgd_checkpoint_extra x;
        run_make(&r, kind, n, opt);
        run_train(&r, first);
        x = run_extra(&r);
        if (dsgd_strategy_save(r.s, path, &x) != DSGD_OK) {
            fprintf(stderr, "child: %s\n", dsgd_ctx_last_error(r.ctx));
            _exit(3);
        }
        run_free(&r);
        _exit(0);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fail_msg("the saving child failed (status %d)", status);
}

static void resume_case(dsgd_strategy_kind kind, int n, dsgd_optimizer_kind opt) {
    /* the cut: step 100 of 200 (the quick tier: 28 of 56, inside the
       warm-up; both after an epoch's first batch) */
    const int first = TU_PICK(100, 28);
    char path[256];
    run a, b;
    dsgd_checkpoint_extra x;
    static outcome want, got;
    path_of(path, "resume.ckpt");
    child_train_and_save(kind, n, opt, first, path);
    /* the uninterrupted run */
    run_make(&a, kind, n, opt);
    run_train(&a, 2 * first);
    run_outcome(&a, &want);
    /* the resumed run */
    run_make(&b, kind, n, opt);
    x = run_extra(&b);
    TU_OK(b.ctx, dsgd_strategy_restore(b.s, path, &x));
    assert_int_equal(b.u.steps, first);
    run_train(&b, first);
    run_outcome(&b, &got);
    expect_same(&got, &want);
    assert_int_equal(b.u.steps, 2 * first);
    assert_true(a.epochs_checked >= TU_PICK(10, 6) && b.epochs_checked >= TU_PICK(5, 3));
    run_free(&a);
    run_free(&b);
}

static void test_resume_mirrored_n1(void **state) {
    (void)state;
    resume_case(DSGD_STRATEGY_MIRRORED, 1, DSGD_OPT_SGD);
    resume_case(DSGD_STRATEGY_MIRRORED, 1, DSGD_OPT_MOMENTUM);
    resume_case(DSGD_STRATEGY_MIRRORED, 1, DSGD_OPT_ADAM);
}

static void test_resume_mirrored_n4(void **state) {
    (void)state;
    resume_case(DSGD_STRATEGY_MIRRORED, 4, DSGD_OPT_SGD);
    resume_case(DSGD_STRATEGY_MIRRORED, 4, DSGD_OPT_MOMENTUM);
    resume_case(DSGD_STRATEGY_MIRRORED, 4, DSGD_OPT_ADAM);
}

static void test_resume_central(void **state) {
    (void)state;
    resume_case(DSGD_STRATEGY_CENTRAL_STORAGE, 2, DSGD_OPT_ADAM);
}

/* 4 -> 2 replicas with the same global batch. */
static void test_resume_other_replica_count(void **state) {
    char path[256];
    run a, b;
    dsgd_checkpoint_extra x;
    static outcome want, got;
    double err;
    (void)state;
    path_of(path, "resize.ckpt");
    child_train_and_save(DSGD_STRATEGY_MIRRORED, 4, DSGD_OPT_ADAM, 100, path);
    run_make(&a, DSGD_STRATEGY_MIRRORED, 4, DSGD_OPT_ADAM);
    run_train(&a, 200);
    run_outcome(&a, &want);
    run_make(&b, DSGD_STRATEGY_MIRRORED, 2, DSGD_OPT_ADAM);
    x = run_extra(&b);
    TU_OK(b.ctx, dsgd_strategy_restore(b.s, path, &x));
    assert_true(b.smp.cursor > 0 && b.smp.cursor < NSAMPLES); /* the checkpoint cut an epoch */
    /* the ON_READ SUM variable reads as it did: 100 steps of 4 replicas
       adding 0.25 (r + 1) and 0.1 each */
    TU_OK(b.ctx, dsgd_strategy_read_variable(b.s, b.var_sum, got.sum));
    TU_NEAR(got.sum[0], 250.0, 1e-3);
    TU_NEAR(got.sum[2], 40.0, 1e-3);
    run_train(&b, 100);    /* run_train checks each epoch's samples, the cut one too */
    run_outcome(&b, &got);
    err = tu_rel_err(got.params, want.params, NPARAMS);
    print_message("4 -> 2 replicas: relative error %.3g after 100 more steps\n", err);
    assert_true(err <= 1e-5);
    assert_true(b.epochs_checked >= 5);
    /* the metrics and the ON_READ SUM variable: combined, not lost */
    TU_NEAR(got.train.count, want.train.count, 0);
    TU_NEAR(got.train.loss_sum, want.train.loss_sum, 1e-4 * fabs(want.train.loss_sum));
    TU_NEAR(got.mean[1], want.mean[1], 1e-5); /* ON_WRITE MEAN: the same value whatever N */
    run_free(&a);
    run_free(&b);
}

/* ---------------------------------------------------------------- the model-level functions */

typedef struct single {
    dsgd_ctx *ctx;
    dsgd_model *m;
    dsgd_optimizer *opt;
} single;

static void single_make(single *s, const dsgd_layer_desc *layers, int nl, int in, dsgd_optimizer_kind kind) {
    dsgd_model_desc md = model_desc(GBATCH);
    dsgd_optimizer_desc od = opt_desc(kind);
    md.layers = layers;
    md.num_layers = nl;
    md.input_dim = in;
    s->ctx = tu_ctx();
    TU_OK(s->ctx, dsgd_model_create(s->ctx, &md, &s->m));
    TU_OK(s->ctx, dsgd_optimizer_create(s->m, &od, &s->opt));
}

static void single_free(single *s) {
    dsgd_optimizer_destroy(s->opt);
    dsgd_model_destroy(s->m);
    dsgd_ctx_destroy(s->ctx);
}

static void single_train(single *s, int first, int steps) {
    int t;
    for (t = first; t < first + steps; ++t) {
        int off = (t * GBATCH) % (NSAMPLES - GBATCH);
        TU_OK(s->ctx, dsgd_model_compute_gradients(s->m, g_x + off * IN, g_y + off, GBATCH, 1.0f / GBATCH));
        TU_OK(s->ctx, dsgd_optimizer_step(s->opt));
    }
}

/* The whole state of a single model: parameters, slots, step, metrics. */
static void single_state(single *s, float *out) {
    size_t p = dsgd_model_num_params(s->m);
    int k;
    dsgd_metrics mt;
    TU_OK(s->ctx, dsgd_model_get_params(s->m, out, p));
    for (k = 0; k < dsgd_optimizer_num_slots(s->opt); ++k)
        TU_OK(s->ctx, dsgd_optimizer_read_slot(s->opt, k, 0, p, out + (size_t)(k + 1) * p));
    out[3 * p] = (float)dsgd_optimizer_steps(s->opt);
    TU_OK(s->ctx, dsgd_model_take_metrics(s->m, DSGD_METRICS_TRAIN, &mt));
    out[3 * p + 1] = (float)mt.loss_sum;
    out[3 * p + 2] = (float)mt.count;
}

static void test_model_resume(void **state) {
    static const dsgd_optimizer_kind kinds[3] = {DSGD_OPT_SGD, DSGD_OPT_MOMENTUM, DSGD_OPT_ADAM};
    char path[256];
    float *want = tu_floats(3 * NPARAMS + 3), *got = tu_floats(3 * NPARAMS + 3);
    int k;
    (void)state;
    path_of(path, "model.ckpt");
    for (k = 0; k < 3; ++k) {
        single a, b;
        memset(want, 0, (3 * NPARAMS + 3) * sizeof(float));
        memset(got, 0, (3 * NPARAMS + 3) * sizeof(float));
        single_make(&a, LAYERS, 3, IN, kinds[k]);
        single_train(&a, 0, 100);
        TU_OK(a.ctx, dsgd_model_save(a.m, a.opt, path, NULL));
        TU_OK(a.ctx, dsgd_checkpoint_verify(a.ctx, path));
        single_train(&a, 100, 100);
        single_state(&a, want);
        single_make(&b, LAYERS, 3, IN, kinds[k]);
        TU_OK(b.ctx, dsgd_model_restore(b.m, b.opt, path, NULL));
        assert_int_equal(dsgd_optimizer_steps(b.opt), 100);
        single_train(&b, 100, 100);
        single_state(&b, got);
        assert_memory_equal(got, want, (3 * NPARAMS + 3) * sizeof(float));
        single_free(&a);
        single_free(&b);
    }
    free(want);
    free(got);
}

/* ---------------------------------------------------------------- crash consistency */

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    unsigned char *buf;
    long n;
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = (unsigned char *)tu_alloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) fail_msg("cannot read %s", path);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* How many entries of dir start with prefix. */
static int count_prefixed(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    assert_non_null(d);
    while ((e = readdir(d)) != NULL) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

static void test_crash_consistency(void **state) {
    static const dsgd_layer_desc big[3] = {{256, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                           {256, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                           {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    char path[256], newer[256];
    unsigned char *old_img, *new_img, *img;
    size_t old_len, new_len, len;
    single s;
    float *p;
    size_t np;
    double t0, save_s;
    /* the quick tier: 20 kills, the i-th at a random point of the i-th
       twentieth of the window, so they still reach every stage of the save
       (and past it); make test-full: 200 at random points of the window */
    const int kills = TU_PICK(200, 20);
    int i, olds = 0, news = 0;
    tu_rng rng = tu_rng_make(5);
    (void)state;
    single_make(&s, big, 3, IN, DSGD_OPT_ADAM);
    np = dsgd_model_num_params(s.m);
    p = tu_floats(np);
    path_of(path, "crash.ckpt");
    path_of(newer, "crash_new.ckpt");
    TU_OK(s.ctx, dsgd_model_save(s.m, s.opt, path, NULL));
    old_img = slurp(path, &old_len);
    /* the new state, and how long saving it takes */
    TU_OK(s.ctx, dsgd_model_get_params(s.m, p, np));
    p[0] += 1.0f;
    TU_OK(s.ctx, dsgd_model_set_params(s.m, p, np));
    t0 = dsgd_now();
    TU_OK(s.ctx, dsgd_model_save(s.m, s.opt, newer, NULL));
    save_s = dsgd_now() - t0;
    new_img = slurp(newer, &new_len);
    p[0] -= 1.0f;
    TU_OK(s.ctx, dsgd_model_set_params(s.m, p, np));
    for (i = 0; i < kills; ++i) {
        pid_t pid;
        int status;
        double u = tu_unit(&rng), delay = (tu_full() ? u : (i + u) / kills) * save_s * 1.5;
        struct timespec ts;
        fflush(NULL);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            p[0] += 1.0f;
            if (dsgd_model_set_params(s.m, p, np) != DSGD_OK || dsgd_model_save(s.m, s.opt, path, NULL) != DSGD_OK)
                _exit(3);
            for (;;) pause(); /* saved: wait for the kill */
        }
        ts.tv_sec = (time_t)delay;
        ts.tv_nsec = (long)((delay - (double)ts.tv_sec) * 1e9);
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status));
        img = slurp(path, &len);
        if (len == old_len && memcmp(img, old_img, len) == 0) olds++;
        else if (len == new_len && memcmp(img, new_img, len) == 0) news++;
        else fail_msg("kill %d after %.2f ms: the file is neither the old nor the new checkpoint (%zu bytes)", i,
                      delay * 1e3, len);
        free(img);
        TU_OK(s.ctx, dsgd_checkpoint_verify(s.ctx, path));
        TU_OK(s.ctx, dsgd_model_save(s.m, s.opt, path, NULL)); /* the old one again */
    }
    print_message("crash consistency: save takes %.2f ms (%zu bytes); %d kills: %d old, %d new\n", save_s * 1e3,
                  new_len, kills, olds, news);
    assert_int_equal(count_prefixed(g_dir, "crash.ckpt."), 0); /* the killed saves' temporaries went */
    free(old_img);
    free(new_img);
    free(p);
    single_free(&s);
}

/* ---------------------------------------------------------------- stale temporaries */

/* This machine's name as the temporary names carry it (see CHECKPOINTS). */
static void host_name(char out[65]) {
    char h[256];
    size_t i;
    if (gethostname(h, sizeof(h) - 1) != 0 || h[0] == '\0') strcpy(h, "unknown");
    h[sizeof(h) - 1] = '\0';
    for (i = 0; h[i] && i < 64; ++i)
        out[i] = (char)((h[i] >= 'a' && h[i] <= 'z') || (h[i] >= 'A' && h[i] <= 'Z') || (h[i] >= '0' && h[i] <= '9') ||
                                h[i] == '-'
                            ? h[i]
                            : '_');
    out[i] = '\0';
}

/* The pid of a process that has exited and been reaped. */
static long dead_pid(void) {
    int status;
    pid_t pid;
    fflush(NULL);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(kill(pid, 0) != 0 && errno == ESRCH);
    return (long)pid;
}

static int exists(const char *dir, const char *name) {
    char path[512];
    if (snprintf(path, sizeof(path), "%s/%s", dir, name) >= (int)sizeof(path)) fail_msg("path too long");
    return access(path, F_OK) == 0;
}

/* Plants name in dir holding name itself, or checks it still does. */
static void plant(const char *dir, const char *name) {
    char path[512];
    tu_write_file(dir, name, name, strlen(name), path, sizeof(path));
}
static void assert_planted(const char *dir, const char *name) {
    char path[512];
    size_t len;
    unsigned char *img;
    if (snprintf(path, sizeof(path), "%s/%s", dir, name) >= (int)sizeof(path)) fail_msg("path too long");
    img = slurp(path, &len);
    if (len != strlen(name) || memcmp(img, name, len) != 0) fail_msg("%s was changed", name);
    free(img);
}

static void test_stale_temporaries(void **state) {
    enum { NSTALE = 3, NKEEP = 11 };
    char host[65], path[256], stale[NSTALE][160], keep[NKEEP][160], cwd[512];
    long dead = dead_pid(), dead2 = dead_pid(), me = (long)getpid();
    single s;
    int i;
    (void)state;
    host_name(host);
    single_make(&s, LAYERS, 3, IN, DSGD_OPT_SGD);
    path_of(path, "stale.ckpt");
    TU_OK(s.ctx, dsgd_model_save(s.m, s.opt, path, NULL));
    /* what killed saves of stale.ckpt on this machine leave */
    snprintf(stale[0], 160, "stale.ckpt.tmp.%s.%ld.Ab3dE9", host, dead);
    snprintf(stale[1], 160, "stale.ckpt.tmp.%s.%ld.zzzzzz", host, dead);
    snprintf(stale[2], 160, "stale.ckpt.tmp.%s.%ld.000000", host, dead2);
    /* what must stay */
    snprintf(keep[0], 160, "stale.ckpt.tmp.%s.%ld.Ab3dE9", host, me);            /* a live writer's */
    snprintf(keep[1], 160, "stale.ckpt.tmp.%s-elsewhere.%ld.Ab3dE9", host, dead); /* another machine's */
    snprintf(keep[2], 160, "other.ckpt.tmp.%s.%ld.Ab3dE9", host, dead);           /* another path's */
    snprintf(keep[3], 160, "stale.ckpt2.tmp.%s.%ld.Ab3dE9", host, dead);          /* a longer path's */
    snprintf(keep[4], 160, "stale.ckpt.tmp.%s.%ld.Ab3dE9x", host, dead);          /* near-misses */
    snprintf(keep[5], 160, "stale.ckpt.tmp.%s.%ld", host, dead);
    snprintf(keep[6], 160, "stale.ckpt.tmp.%s.0%ld.Ab3dE9", host, dead);
    snprintf(keep[7], 160, "stale.ckpt.tmp.%s.%ld.Ab-dE9", host, dead);
    snprintf(keep[8], 160, "stale.ckpt.Ab3dE9");                                  /* unrelated files */
    snprintf(keep[9], 160, "stale.ckpt.bak");
    snprintf(keep[10], 160, "notes.txt");
    for (i = 0; i < NSTALE; ++i) plant(g_dir, stale[i]);
    for (i = 0; i < NKEEP; ++i) plant(g_dir, keep[i]);
    TU_OK(s.ctx, dsgd_model_save(s.m, s.opt, path, NULL));
    TU_OK(s.ctx, dsgd_checkpoint_verify(s.ctx, path));
    for (i = 0; i < NSTALE; ++i)
        if (exists(g_dir, stale[i])) fail_msg("the stale temporary %s is still there", stale[i]);
    for (i = 0; i < NKEEP; ++i) assert_planted(g_dir, keep[i]);
    assert_int_equal(count_prefixed(g_dir, ""), 2 + NKEEP + 1); /* ".", "..", the kept ones, stale.ckpt */

    /* a path without a directory: the current one */
    assert_non_null(getcwd(cwd, sizeof(cwd)));
    assert_int_equal(chdir(g_dir), 0);
    snprintf(stale[0], 160, "rel.ckpt.tmp.%s.%ld.qwerty", host, dead);
    snprintf(keep[0], 160, "rel.ckpt.tmp.%s.%ld.qwerty", host, me);
    plant(".", stale[0]);
    plant(".", keep[0]);
    TU_OK(s.ctx, dsgd_model_save(s.m, s.opt, "rel.ckpt", NULL));
    assert_int_equal(chdir(cwd), 0);
    assert_false(exists(g_dir, stale[0]));
    assert_planted(g_dir, keep[0]);
    assert_true(exists(g_dir, "rel.ckpt"));
    single_free(&s);
}

/* ---------------------------------------------------------------- corruption and mismatches */

static const dsgd_layer_desc tiny[2] = {{4, DSGD_ACT_TANH, DSGD_INIT_AUTO}, {2, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
static const dsgd_layer_desc tiny5[2] = {{5, DSGD_ACT_TANH, DSGD_INIT_AUTO}, {2, DSGD_ACT_NONE, DSGD_INIT_AUTO}};

typedef struct snapshot {
    float v[3 * 64 + 1];
    uint64_t epoch;
    size_t cursor;
    unsigned char user[8];
} snapshot;

static void snap(single *s, dsgd_sampler *smp, const unsigned char *user, snapshot *out) {
    size_t p = dsgd_model_num_params(s->m);
    memset(out, 0, sizeof(*out));
    TU_OK(s->ctx, dsgd_model_get_params(s->m, out->v, p));
    TU_OK(s->ctx, dsgd_optimizer_read_slot(s->opt, 0, 0, p, out->v + p));
    TU_OK(s->ctx, dsgd_optimizer_read_slot(s->opt, 1, 0, p, out->v + 2 * p));
    out->v[3 * p] = (float)dsgd_optimizer_steps(s->opt);
    out->epoch = smp->epoch;
    out->cursor = smp->cursor;
    memcpy(out->user, user, 8);
}

/* The quick tier's share of test_corruption, from the file's layout
   (CHECKPOINTS in distsgd/checkpoint.h: a 32-byte header, then sections of
   a 16-byte name, a u64 size, the bytes and a u32 CRC32C). flips[b] is the
   mask of the bits of byte b flipped: every bit of the two low bytes of
   each section's size (sizes a little off and past the file), one bit
   (in turns) of each remaining byte of the header, the names, the sizes
   and the CRCs, and one bit of every eighth byte of the sections' contents.
   cuts[c] is 1 where a truncation to c bytes is kept: inside the header,
   at each section's start (whole sections, the next one missing), inside
   its name, at and inside its size, at its bytes' start and middle, at and
   inside its CRC, and one byte short of the end. make test-full flips
   every bit and cuts at every byte. */
static void corruption_points(const unsigned char *img, size_t len, unsigned char *flips, unsigned char *cuts) {
    size_t at = 32, i;
    memset(flips, 0, len);
    memset(cuts, 0, len);
    assert_true(len > 32);
    for (i = 0; i < 32; ++i) {
        flips[i] = (unsigned char)(1u << (i % 8));
        cuts[i] = 1;
    }
    while (at < len) {
        uint64_t size = 0;
        int k;
        assert_true(len - at >= 16 + 8 + 4);
        for (k = 7; k >= 0; --k) size = size << 8 | img[at + 16 + (size_t)k];
        assert_true(size <= len - at - 16 - 8 - 4);
        for (i = at; i < at + 24 + size + 4; ++i)
            if (i < at + 24 || i >= at + 24 + size) flips[i] = (unsigned char)(1u << (i % 8));
            else if ((i - at - 24) % 8 == 0) flips[i] = (unsigned char)(1u << ((i - at - 24) / 8 % 8));
        flips[at + 16] = flips[at + 17] = 0xFF;
        cuts[at] = cuts[at + 1] = cuts[at + 16] = cuts[at + 20] = 1;
        cuts[at + 24] = cuts[at + 24 + size / 2] = cuts[at + 24 + size] = cuts[at + 24 + size + 2] = 1;
        at += 24 + size + 4;
    }
    assert_true(at == len); /* the sections end where the file does */
    cuts[len - 1] = 1;
}

static void test_corruption(void **state) {
    char path[256], bad[256];
    unsigned char *img, *copy, user[8] = {1, 2, 3, 4, 5, 6, 7, 8}, mine[8] = {9, 9, 9, 9, 9, 9, 9, 9};
    unsigned char *flips, *cuts;
    size_t len, bit, cut;
    single s, t;
    dsgd_sampler smp, smp2;
    dsgd_checkpoint_extra x, y;
    snapshot before, after;
    const size_t *idx;
    int formats = 0, cuts_done = 0;
    (void)state;
    single_make(&s, tiny, 2, 3, DSGD_OPT_ADAM);
    TU_OK(s.ctx, dsgd_sampler_init(s.ctx, &smp, 50, 8, 3, 1, 0));
    dsgd_sampler_set_epoch(&smp, 4);
    dsgd_sampler_next(&smp, &idx);
    {
        float y2[8] = {0, 1, 1, 0, 1, 0, 0, 1};
        TU_OK(s.ctx, dsgd_model_compute_gradients(s.m, g_x, y2, 8, 0.125f));
    }
    TU_OK(s.ctx, dsgd_optimizer_step(s.opt));
    x.sampler = &smp;
    x.user = user;
    x.user_bytes = sizeof(user);
    path_of(path, "small.ckpt");
    path_of(bad, "bad.ckpt");
    TU_OK(s.ctx, dsgd_model_save(s.m, s.opt, path, &x));
    img = slurp(path, &len);
    copy = (unsigned char *)tu_alloc(len);
    flips = (unsigned char *)tu_alloc(len);
    cuts = (unsigned char *)tu_alloc(len);
    corruption_points(img, len, flips, cuts);
    /* the target: another state, which no failed restore may change */
    single_make(&t, tiny, 2, 3, DSGD_OPT_ADAM);
    TU_OK(t.ctx, dsgd_sampler_init(t.ctx, &smp2, 50, 8, 3, 1, 0));
    y.sampler = &smp2;
    y.user = mine;
    y.user_bytes = sizeof(mine);
    snap(&t, &smp2, mine, &before);
    for (bit = 0; bit < len * 8; ++bit) {
        FILE *f;
        if (!tu_full() && !(flips[bit / 8] >> (bit % 8) & 1)) continue;
        memcpy(copy, img, len);
        copy[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        f = fopen(bad, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(copy, 1, len, f), len);
        fclose(f);
        TU_ERR(t.ctx, DSGD_ERR_FORMAT, dsgd_model_restore(t.m, t.opt, bad, &y));
        formats++;
    }
    for (cut = 0; cut < len; ++cut) {
        FILE *f;
        if (!tu_full() && !cuts[cut]) continue;
        f = fopen(bad, "wb");
        assert_non_null(f);
        if (cut) assert_int_equal(fwrite(img, 1, cut, f), cut);
        fclose(f);
        TU_ERR(t.ctx, DSGD_ERR_FORMAT, dsgd_model_restore(t.m, t.opt, bad, &y));
        TU_ERR(t.ctx, DSGD_ERR_FORMAT, dsgd_checkpoint_verify(t.ctx, bad));
        cuts_done++;
    }
    snap(&t, &smp2, mine, &after);
    assert_memory_equal(&after, &before, sizeof(before));
    print_message("%zu-byte checkpoint: %d bit flips and %d truncations rejected, nothing touched\n", len, formats,
                  cuts_done);
    /* the intact file restores everything */
    TU_OK(t.ctx, dsgd_model_restore(t.m, t.opt, path, &y));
    assert_memory_equal(mine, user, 8);
    assert_int_equal(smp2.epoch, 4);
    assert_int_equal(smp2.cursor, 8);
    assert_int_equal(dsgd_optimizer_steps(t.opt), 1);
    free(img);
    free(copy);
    free(flips);
    free(cuts);
    dsgd_sampler_free(&smp);
    dsgd_sampler_free(&smp2);
    single_free(&s);
    single_free(&t);
}

static void test_mismatches(void **state) {
    char path[256], noopt[256];
    unsigned char user[8] = {0}, user9[9] = {0};
    single s, other, sgd;
    dsgd_sampler smp, smp_seed;
    dsgd_checkpoint_extra x;
    const char *msg;
    (void)state;
    single_make(&s, tiny, 2, 3, DSGD_OPT_ADAM);
    TU_OK(s.ctx, dsgd_sampler_init(s.ctx, &smp, 50, 8, 3, 1, 0));
    TU_OK(s.ctx, dsgd_sampler_init(s.ctx, &smp_seed, 50, 8, 4, 1, 0));
    x.sampler = &smp;
    x.user = user;
    x.user_bytes = sizeof(user);
    path_of(path, "m.ckpt");
    path_of(noopt, "noopt.ckpt");
    TU_OK(s.ctx, dsgd_model_save(s.m, s.opt, path, &x));
    TU_OK(s.ctx, dsgd_model_save(s.m, NULL, noopt, NULL));
    /* another shape */
    single_make(&other, tiny5, 2, 3, DSGD_OPT_ADAM);
    TU_ERR(other.ctx, DSGD_ERR_SHAPE, dsgd_model_restore(other.m, other.opt, path, NULL));
    msg = dsgd_ctx_last_error(other.ctx);
    if (!contains(msg, "dense0/kernel") || !contains(msg, "3x4") || !contains(msg, "3x5"))
        fail_msg("the shape mismatch is not named: %s", msg);
    /* another optimizer kind; a missing part */
    single_make(&sgd, tiny, 2, 3, DSGD_OPT_SGD);
    TU_ERR(sgd.ctx, DSGD_ERR_SHAPE, dsgd_model_restore(sgd.m, sgd.opt, path, NULL));
    if (!contains(dsgd_ctx_last_error(sgd.ctx), "ADAM")) fail_msg("%s", dsgd_ctx_last_error(sgd.ctx));
    TU_OK(sgd.ctx, dsgd_model_restore(sgd.m, NULL, path, NULL)); /* the parameters alone */
    TU_ERR(s.ctx, DSGD_ERR_SHAPE, dsgd_model_restore(s.m, s.opt, noopt, NULL));
    if (!contains(dsgd_ctx_last_error(s.ctx), "\"optimizer\"")) fail_msg("%s", dsgd_ctx_last_error(s.ctx));
    TU_ERR(s.ctx, DSGD_ERR_SHAPE, dsgd_model_restore(s.m, NULL, noopt, &x));
    if (!contains(dsgd_ctx_last_error(s.ctx), "\"sampler\"")) fail_msg("%s", dsgd_ctx_last_error(s.ctx));
    /* another sampler, another user size */
    x.sampler = &smp_seed;
    TU_ERR(s.ctx, DSGD_ERR_SHAPE, dsgd_model_restore(s.m, s.opt, path, &x));
    if (!contains(dsgd_ctx_last_error(s.ctx), "seed 3")) fail_msg("%s", dsgd_ctx_last_error(s.ctx));
    x.sampler = &smp;
    x.user = user9;
    x.user_bytes = sizeof(user9);
    TU_ERR(s.ctx, DSGD_ERR_SHAPE, dsgd_model_restore(s.m, s.opt, path, &x));
    if (!contains(dsgd_ctx_last_error(s.ctx), "8 bytes, not 9")) fail_msg("%s", dsgd_ctx_last_error(s.ctx));
    /* bad arguments, missing files, unwritable places */
    TU_ERR(s.ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_save(s.m, s.opt, NULL, NULL));
    TU_ERR(s.ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_save(s.m, s.opt, "", NULL));
    TU_ERR(s.ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_save(s.m, other.opt, path, NULL));
    x.user = NULL;
    TU_ERR(s.ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_save(s.m, s.opt, path, &x));
    assert_int_equal(dsgd_model_save(NULL, NULL, path, NULL), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_model_restore(NULL, NULL, path, NULL), DSGD_ERR_INVALID_ARGUMENT);
    TU_ERR(s.ctx, DSGD_ERR_IO, dsgd_model_save(s.m, s.opt, "/nonexistent-dir/x.ckpt", NULL));
    if (!contains(dsgd_ctx_last_error(s.ctx), "/nonexistent-dir/x.ckpt")) fail_msg("%s", dsgd_ctx_last_error(s.ctx));
    TU_ERR(s.ctx, DSGD_ERR_IO, dsgd_model_restore(s.m, s.opt, "/nonexistent-dir/x.ckpt", NULL));
    TU_ERR(s.ctx, DSGD_ERR_IO, dsgd_checkpoint_verify(s.ctx, g_dir)); /* a directory */
    dsgd_sampler_free(&smp);
    dsgd_sampler_free(&smp_seed);
    single_free(&s);
    single_free(&other);
    single_free(&sgd);
}

static dsgd_result fail_on_one(dsgd_replica *rep, void *user) {
    (void)user;
    return dsgd_replica_id(rep) == 1 ? dsgd_ctx_set_error(dsgd_replica_ctx(rep), DSGD_ERR_BACKEND, "on purpose")
                                     : DSGD_OK;
}

static void test_strategy_mismatches(void **state) {
    char path[256], model_path[256];
    run a, b;
    dsgd_dvar_desc vd;
    int id;
    single s;
    (void)state;
    path_of(path, "s.ckpt");
    path_of(model_path, "single.ckpt");
    run_make(&a, DSGD_STRATEGY_MIRRORED, 2, DSGD_OPT_ADAM);
    run_train(&a, 3);
    TU_OK(a.ctx, dsgd_strategy_save(a.s, path, NULL));
    /* a variable the checkpoint lacks */
    run_make(&b, DSGD_STRATEGY_MIRRORED, 2, DSGD_OPT_ADAM);
    memset(&vd, 0, sizeof(vd));
    vd.name = "extra/v";
    vd.count = 1;
    TU_OK(b.ctx, dsgd_strategy_create_variable(b.s, &vd, &id));
    TU_ERR(b.ctx, DSGD_ERR_SHAPE, dsgd_strategy_restore(b.s, path, NULL));
    if (!contains(dsgd_ctx_last_error(b.ctx), "extra/v")) fail_msg("%s", dsgd_ctx_last_error(b.ctx));
    run_free(&b);
    /* a model's checkpoint into a strategy with variables of its own */
    single_make(&s, LAYERS, 3, IN, DSGD_OPT_ADAM);
    TU_OK(s.ctx, dsgd_model_save(s.m, s.opt, model_path, NULL));
    run_make(&b, DSGD_STRATEGY_MIRRORED, 2, DSGD_OPT_ADAM);
    TU_ERR(b.ctx, DSGD_ERR_SHAPE, dsgd_strategy_restore(b.s, model_path, NULL));
    if (!contains(dsgd_ctx_last_error(b.ctx), "user/sum")) fail_msg("%s", dsgd_ctx_last_error(b.ctx));
    run_free(&b);
    /* and the strategy's checkpoint into a single model: replica 0's view */
    TU_OK(s.ctx, dsgd_model_restore(s.m, s.opt, path, NULL));
    assert_int_equal(dsgd_optimizer_steps(s.opt), 3);
    single_free(&s);
    /* a failed strategy neither saves nor restores */
    assert_int_not_equal(dsgd_strategy_run(a.s, fail_on_one, NULL), DSGD_OK);
    assert_true(dsgd_strategy_failed(a.s));
    TU_ERR(a.ctx, DSGD_ERR_STATE, dsgd_strategy_save(a.s, path, NULL));
    TU_ERR(a.ctx, DSGD_ERR_STATE, dsgd_strategy_restore(a.s, path, NULL));
    assert_int_equal(dsgd_strategy_save(NULL, path, NULL), DSGD_ERR_INVALID_ARGUMENT);
    run_free(&a);
}

/* ---------------------------------------------------------------- CRC32C and the sampler's cursor */

/* CRC-32C bit by bit (reflected polynomial 0x82F63B78, initial and final
   complement): the serial reference for the library's table and SSE4.2
   paths. */
static uint32_t crc32c_bitwise(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    size_t i;
    int b;
    for (i = 0; i < n; ++i) {
        c ^= p[i];
        for (b = 0; b < 8; ++b) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    }
    return ~c;
}

static void test_crc32c(void **state) {
    static unsigned char buf[40000];
    size_t off, n;
    tu_rng r = tu_rng_make(11);
    (void)state;
    assert_int_equal(dsgd_crc32c(0, "123456789", 9), 0xE3069283u);
    memset(buf, 0, 32);
    assert_int_equal(dsgd_crc32c(0, buf, 32), 0x8A9136AAu);
    memset(buf, 0xFF, 32);
    assert_int_equal(dsgd_crc32c(0, buf, 32), 0x62A8AB43u);
    for (n = 0; n < sizeof(buf); ++n) buf[n] = (unsigned char)(n * 7 + 1);
    /* continuing a CRC equals one pass; every offset and length equals the bitwise reference */
    assert_int_equal(dsgd_crc32c(dsgd_crc32c(0, buf, 100), buf + 100, 200), dsgd_crc32c(0, buf, 300));
    for (off = 0; off < 8; ++off)
        for (n = 0; n <= 300; ++n)
            assert_int_equal(crc32c_bitwise(buf + off, n), dsgd_crc32c(0, buf + off, n));
    /* long inputs (three lanes at once where the CPU has SSE4.2) */
    for (n = 0; n < sizeof(buf); ++n) buf[n] = (unsigned char)tu_next(&r);
    for (n = 0; n < 200; ++n) {
        size_t len = 3000 + tu_below(&r, sizeof(buf) - 3008);
        off = tu_below(&r, 8);
        assert_int_equal(crc32c_bitwise(buf + off, len), dsgd_crc32c(0, buf + off, len));
        assert_int_equal(dsgd_crc32c(dsgd_crc32c(0, buf, len / 2), buf + len / 2, len - len / 2), dsgd_crc32c(0, buf, len));
    }
}

static void test_sampler_cursor(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_sampler s;
    const size_t *idx, *first;
    (void)state;
    TU_OK(ctx, dsgd_sampler_init(ctx, &s, 10, 4, 1, 1, 0));
    assert_int_equal(dsgd_sampler_next(&s, &first), 4);
    assert_true(first == s.order);
    assert_int_equal(dsgd_sampler_next(&s, &idx), 4);
    assert_true(idx == s.order + 4);
    assert_int_equal(dsgd_sampler_next(&s, &idx), 2);
    assert_int_equal(s.cursor, 10);
    assert_int_equal(dsgd_sampler_next(&s, &idx), 0);
    dsgd_sampler_set_epoch(&s, 1);
    assert_int_equal(s.cursor, 0);
    assert_int_equal(dsgd_sampler_next(&s, NULL), 4);
    dsgd_sampler_free(&s);
    TU_OK(ctx, dsgd_sampler_init(ctx, &s, 10, 4, 1, 0, 1)); /* drop_last */
    assert_int_equal(dsgd_sampler_next(&s, &idx), 4);
    assert_int_equal(dsgd_sampler_next(&s, &idx), 4);
    assert_int_equal(dsgd_sampler_next(&s, &idx), 0);
    assert_int_equal(dsgd_sampler_next(NULL, &idx), 0);
    dsgd_sampler_free(&s);
    assert_int_equal(dsgd_sampler_next(&s, &idx), 0); /* freed */
    dsgd_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_resume_mirrored_n1, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_mirrored_n4, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_central, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_other_replica_count, setup, teardown),
        cmocka_unit_test_setup_teardown(test_model_resume, setup, teardown),
        cmocka_unit_test_setup_teardown(test_crash_consistency, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_temporaries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corruption, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mismatches, setup, teardown),
        cmocka_unit_test_setup_teardown(test_strategy_mismatches, setup, teardown),
        cmocka_unit_test_setup_teardown(test_crc32c, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sampler_cursor, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
