/* sim_common.h - what the simulated-cluster experiments share
   (experiments/sync_vs_async_sim.c, backup_workers.c, linear_scaling.c): one
   training run on the simnet transport (distsgd/simnet.h), real gradients
   on a virtual clock, written as CSV rows, plus a gnuplot call.

   A run is either
     - mirrored: dsgd_strategy MIRRORED (or LOCAL, with local_sgd; with a
       comm hook, comm_hook) over the hub's endpoints (hub made
       with park_between_calls, as the replica threads wait for each step
       outside the hub); each replica's batch comes from a dsgd_batch_fn
       that first charges the step's compute (dsgd_simnet_compute); or
     - parameter servers (distsgd/ps.h) in any policy: rank 0 serves, ranks
       1..W are workers, run by the hub (dsgd_simnet_run: fibers on one
       thread, no parking, so P in the hundreds is quick); a worker runs
       the engine's loop (dsgd_ps_worker_run): pulls, computes its
       gradient (on the run's one model, which the workers share: one rank
       runs at a time), charges the compute, pushes.
   Every worker draws its batches from the training set with its own
   generator (seed, rank, step), so a run is a function of its desc: the
   same seed gives the same CSV bytes and the same trace.

   CSV (one row every eval_every updates, and the last):
     run,step,time_s,loss,accuracy,staleness,dropped
   step: optimizer updates applied (the servers' version; mirrored: steps);
   time_s: virtual seconds (mirrored: rank 0's clock after the step; PS:
   worker 1's clock after the pull that fetched those weights); loss and
   accuracy: test set, on those weights; staleness: the mean, over the
   pulls of every worker since the previous row, of the updates that other
   workers applied between its previous pull and this one (for ASYNC the
   staleness of the gradient it pushed in between; 0 for mirrored and
   SYNC); dropped: gradients dropped as stale since the previous row
   (BACKUP's backups). With csv_bytes a last column, bytes_per_worker:
   the payload bytes the workers have sent so far (the hub's count,
   dsgd_simnet_bytes_sent), over the workers (PS: the workers' sends
   only, not the server's). stop_at_target works for mirrored, ASYNC and
   BACKUP (SYNC and SSP need every worker to push equally often: the run
   fails). A caller that wants only the target's first time (a sweep)
   sets target_only: the run then does no work past it. Include this
   file in one translation unit that defines DISTSGD_IMPLEMENTATION
   first. */
#ifndef SIM_COMMON_H
#define SIM_COMMON_H

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Each experiment uses some of these helpers. */
#if defined(__GNUC__) || defined(__clang__)
#define SIM_MAYBE_UNUSED __attribute__((unused))
#else
#define SIM_MAYBE_UNUSED
#endif

/* Copies what f holds (a run's rows, written to a temporary file while
   runs go in parallel) to the end of out, from f's start. */
SIM_MAYBE_UNUSED static void sim_append(FILE *out, FILE *f) {
    char buf[4096];
    size_t k;
    rewind(f);
    while ((k = fread(buf, 1, sizeof(buf), f)) > 0) fwrite(buf, 1, k, out);
}

/* sim_parallel(n, threads, fn, user): fn(user, i) for i = 0 .. n - 1, on up
   to `threads` threads (the caller's among them), each i taken once from a
   shared counter. The experiments' runs are functions of their own
   descs, so what they compute does not depend on which thread ran them. */
typedef struct sim_pool {
    int n, next;
    void (*fn)(void *user, int i);
    void *user;
    pthread_mutex_t mu;
} sim_pool;

SIM_MAYBE_UNUSED static void *sim_pool_thread(void *arg) {
    sim_pool *q = (sim_pool *)arg;
    for (;;) {
        int i;
        pthread_mutex_lock(&q->mu);
        i = q->next < q->n ? q->next++ : -1;
        pthread_mutex_unlock(&q->mu);
        if (i < 0) return NULL;
        q->fn(q->user, i);
    }
}

SIM_MAYBE_UNUSED static void sim_parallel(int n, int threads, void (*fn)(void *user, int i), void *user) {
    enum { SIM_MAX_THREADS = 64 };
    pthread_t th[SIM_MAX_THREADS];
    sim_pool q;
    int i, started = 0;
    q.n = n;
    q.next = 0;
    q.fn = fn;
    q.user = user;
    pthread_mutex_init(&q.mu, NULL);
    for (i = 1; i < threads && i < n && started < SIM_MAX_THREADS; ++i)
        if (pthread_create(&th[started], NULL, sim_pool_thread, &q) == 0) ++started;
    sim_pool_thread(&q);
    for (i = 0; i < started; ++i) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&q.mu);
}

typedef enum sim_kind { SIM_MIRRORED = 0, SIM_PS = 1 } sim_kind;

/* A named network for an experiment's table: alpha (s a message) and beta
   (s a byte) of every link. */
typedef struct net_desc {
    const char *name;
    double alpha, beta;
} net_desc;

typedef struct sim_run_desc {
    const char *name;       /* the CSV's run column */
    sim_kind kind;
    /* SIM_MIRRORED: non-zero trains DSGD_STRATEGY_LOCAL with `local` (the
       rows' weights are replica 0's: evaluate at multiples of the period) */
    int local_sgd;
    dsgd_strategy_local_desc local;
    const dsgd_comm_hook *comm_hook; /* SIM_MIRRORED: the strategy's hook (NULL: none) */
    dsgd_ps_policy policy;  /* SIM_PS */
    int staleness;          /* SSP's bound (other policies: 0) */
    int backups;            /* BACKUP's b (other policies: 0) */
    int backup_cancel;      /* BACKUP: late workers abandon their gradient
                               and restart on the new step (the compute is
                               charged through dsgd_ps_worker_compute_for,
                               one fresh draw per attempt); 0: TF's protocol */
    int workers;            /* replicas, or PS workers (N + b) */
    int batch;              /* per worker */
    const dsgd_layer_desc *layers;
    int num_layers;
    dsgd_optimizer_desc optimizer;
    /* stop: mirrored, SYNC, SSP after `steps` updates (SSP: pushes per
       worker), BACKUP once the version reaches `steps`, ASYNC once a
       worker's clock reaches max_time_s (> 0; steps: at most that many
       updates; 0 none). A parameter-server run needs steps > 0 or
       max_time_s > 0. */
    long steps;
    double max_time_s;
    int eval_every;         /* updates between rows */
    int stop_at_target;     /* non-zero: stop once test accuracy >= target */
    double target;          /* test accuracy whose first time is reported */
    /* non-zero (csv NULL): only the target's first time is wanted
       (time_to_target, steps_to_target, bytes_to_target). Once the target
       is reached, or give_up_s passed, a run that stops at the target
       stops; a parameter-server one that cannot (SSP, SYNC) stops every
       worker at one push count, one past the most any has made (as a run
       of that many steps would), a BACKUP one without stop_at_target goes
       on without evaluating or computing gradients (its workers push zeros
       and charge their compute times as before); the other fields of
       sim_result then hold the last row evaluated. */
    int target_only;
    /* > 0, with target_only: a row at this virtual time or later that is
       below the target ends the search (the run counts as not reaching
       it): a caller comparing the time to target against a bound needs
       no more */
    double give_up_s;
    dsgd_simnet_desc net;   /* links and compute model; ranks, parking set here */
    int csv_bytes;          /* non-zero: the rows end with bytes_per_worker */
    int ps_draw_as_replica; /* SIM_PS: worker rank w draws the batches of
                               mirrored replica w - 1 (0: of rank w) */
    FILE *csv;              /* rows go here (NULL: none) */
    const char *trace_path; /* non-NULL: a Chrome trace of the run's first trace_until_s */
    double trace_until_s;
    uint64_t seed;
} sim_run_desc;

typedef struct sim_result {
    double time_to_target; /* virtual seconds; -1: not reached */
    long steps_to_target;
    double bytes_to_target; /* bytes sent per worker by the row that reached it */
    double final_bytes;     /* ... by the last row */
    double final_time, final_accuracy, final_loss;
    long updates;
    double staleness_mean; /* PS: the servers' (exact); mirrored 0 */
    long dropped;
    uint64_t events; /* the hub's messages + compute charges */
    double wall_s;
} sim_result;

typedef struct sim_data {
    dsgd_dataset train, test;
} sim_data;

/* ---------------------------------------------------------------- data */

/* The vendored UCI digits (1797 8x8 images, pixels 0..16): 1437 to train,
   360 to test, split by seed. */
SIM_MAYBE_UNUSED static int sim_load_digits(dsgd_ctx *ctx, const char *path, uint64_t seed, sim_data *d) {
    dsgd_csv_desc csv;
    dsgd_dataset all;
    memset(&csv, 0, sizeof(csv));
    memset(d, 0, sizeof(*d));
    csv.num_classes = 10;
    csv.feature_scale = 1.0f / 16.0f;
    if (dsgd_dataset_load_csv(ctx, path, &csv, &all) != DSGD_OK) return -1;
    if (dsgd_dataset_split(ctx, &all, 1437, seed, &d->train, &d->test) != DSGD_OK) {
        dsgd_dataset_free(&all);
        return -1;
    }
    dsgd_dataset_free(&all);
    return 0;
}

/* Fashion-MNIST from its uncompressed IDX files in dir. */
SIM_MAYBE_UNUSED static int sim_load_fashion(dsgd_ctx *ctx, const char *dir, sim_data *d) {
    char a[1024], b[1024];
    memset(d, 0, sizeof(*d));
    snprintf(a, sizeof(a), "%s/train-images-idx3-ubyte", dir);
    snprintf(b, sizeof(b), "%s/train-labels-idx1-ubyte", dir);
    if (dsgd_dataset_load_idx(ctx, a, b, 10, &d->train) != DSGD_OK) return -1;
    snprintf(a, sizeof(a), "%s/t10k-images-idx3-ubyte", dir);
    snprintf(b, sizeof(b), "%s/t10k-labels-idx1-ubyte", dir);
    if (dsgd_dataset_load_idx(ctx, a, b, 10, &d->test) != DSGD_OK) return -1;
    return 0;
}

static void sim_data_free(sim_data *d) {
    dsgd_dataset_free(&d->train);
    dsgd_dataset_free(&d->test);
}

/* Batch `step` of worker `rank`: B indices drawn uniformly (with
   replacement) by a generator of (seed, rank, step), gathered into x, y. */
static void sim_draw(const dsgd_dataset *ds, uint64_t seed, int rank, long step, int B, float *x, float *y) {
    uint64_t s = seed ^ ((uint64_t)(rank + 1) * 0xD1B54A32D192ED03ull) ^ ((uint64_t)(step + 1) * 0x9E3779B97F4A7C15ull);
    int i;
    dsgd_rng_next(&s);
    for (i = 0; i < B; ++i) {
        size_t k = (size_t)(dsgd_rng_next(&s) % ds->n);
        memcpy(x + (size_t)i * (size_t)ds->dim, ds->x + k * (size_t)ds->dim, sizeof(float) * (size_t)ds->dim);
        y[i] = ds->y[k];
    }
}

/* Test loss and accuracy of model m (its own thread). */
static void sim_evaluate(dsgd_model *m, const dsgd_dataset *test, double *loss, double *acc) {
    dsgd_metrics te;
    size_t i;
    int chunk = dsgd_model_max_batch(m);
    for (i = 0; i < test->n; i += (size_t)chunk) {
        int n = (int)(test->n - i < (size_t)chunk ? test->n - i : (size_t)chunk);
        dsgd_model_eval_batch(m, test->x + i * (size_t)test->dim, test->y + i, n);
    }
    dsgd_model_take_metrics(m, DSGD_METRICS_EVAL, &te);
    *loss = te.count > 0 ? te.loss_sum / te.count : 0;
    *acc = te.count > 0 ? te.correct / te.count : 0;
}

/* ---------------------------------------------------------------- rows */

typedef struct sim_rows {
    const sim_run_desc *d;
    sim_result *res;
    long next_eval;
    /* since the last row: pulls seen and their staleness, gradients dropped */
    long pulls;
    double stale_sum;
    long dropped, dropped_total;
    int stop; /* the target was reached (or given up) and stop_at_target */
    int done; /* target_only: the target was reached or given up */
} sim_rows;

SIM_MAYBE_UNUSED static void sim_csv_header(FILE *f) {
    if (f) fprintf(f, "run,step,time_s,loss,accuracy,staleness,dropped\n");
}

/* With sim_run_desc.csv_bytes. */
SIM_MAYBE_UNUSED static void sim_csv_header_bytes(FILE *f) {
    if (f) fprintf(f, "run,step,time_s,loss,accuracy,staleness,dropped,bytes_per_worker\n");
}

/* The mean over ranks first .. first + n - 1 of the bytes each has sent. */
static double sim_bytes_per_rank(dsgd_simnet *hub, int first, int n) {
    uint64_t sum = 0;
    int i;
    for (i = first; i < first + n; ++i) sum += dsgd_simnet_bytes_sent(hub, i);
    return (double)sum / (double)n;
}

static void sim_row(sim_rows *r, long step, double t, double loss, double acc, double bytes) {
    const sim_run_desc *d = r->d;
    if (d->csv) {
        fprintf(d->csv, "%s,%ld,%.9g,%.6f,%.6f,%.4f,%ld", d->name, step, t, loss, acc,
                r->pulls ? r->stale_sum / (double)r->pulls : 0.0, r->dropped);
        if (d->csv_bytes) fprintf(d->csv, ",%.0f", bytes);
        fprintf(d->csv, "\n");
    }
    r->pulls = 0;
    r->stale_sum = 0;
    r->dropped = 0;
    if (acc >= d->target && r->res->time_to_target < 0) {
        r->res->time_to_target = t;
        r->res->steps_to_target = step;
        r->res->bytes_to_target = bytes;
        if (d->stop_at_target) r->stop = 1;
    }
    if (d->target_only && (r->res->time_to_target >= 0 || (d->give_up_s > 0 && t >= d->give_up_s))) {
        r->done = 1;
        if (d->stop_at_target) r->stop = 1;
    }
    r->res->final_time = t;
    r->res->final_accuracy = acc;
    r->res->final_loss = loss;
    r->res->final_bytes = bytes;
    r->res->updates = step;
}

/* ---------------------------------------------------------------- mirrored */

typedef struct sim_mirror {
    const sim_run_desc *d;
    const sim_data *data;
    dsgd_simnet *hub;
    long step;
    float *x, *y; /* [workers][batch * dim], [workers][batch] */
} sim_mirror;

/* Runs on replica r's thread before its gradient: the step's compute time
   on the virtual clock, then the replica's batch. */
static dsgd_result sim_mirror_batch(void *user, int r, int n, dsgd_batch *out) {
    sim_mirror *m = (sim_mirror *)user;
    const sim_run_desc *d = m->d;
    size_t dim = (size_t)m->data->train.dim;
    dsgd_result res = dsgd_simnet_compute(m->hub, r, m->step);
    (void)n;
    if (res != DSGD_OK) return res;
    sim_draw(&m->data->train, d->seed, r, m->step, d->batch, m->x + (size_t)r * (size_t)d->batch * dim,
             m->y + (size_t)r * (size_t)d->batch);
    out->x = m->x + (size_t)r * (size_t)d->batch * dim;
    out->y = m->y + (size_t)r * (size_t)d->batch;
    out->count = d->batch;
    return DSGD_OK;
}

static int sim_run_mirrored(dsgd_ctx *ctx, const sim_run_desc *d, const sim_data *data, dsgd_simnet *hub,
                            sim_rows *rows) {
    dsgd_transport_i *ep = (dsgd_transport_i *)calloc((size_t)d->workers, sizeof(*ep));
    dsgd_strategy_desc sd;
    dsgd_strategy *st = NULL;
    dsgd_model_desc md;
    dsgd_model *eval = NULL;
    sim_mirror m;
    float *params = NULL;
    int i, rc = -1;
    memset(&m, 0, sizeof(m));
    m.d = d;
    m.data = data;
    m.hub = hub;
    m.x = (float *)malloc(sizeof(float) * (size_t)d->workers * (size_t)d->batch * (size_t)data->train.dim);
    m.y = (float *)malloc(sizeof(float) * (size_t)d->workers * (size_t)d->batch);
    memset(&md, 0, sizeof(md));
    md.input_dim = data->train.dim;
    md.layers = d->layers;
    md.num_layers = d->num_layers;
    md.max_batch = d->batch < 256 ? 256 : d->batch;
    md.seed = d->seed;
    memset(&sd, 0, sizeof(sd));
    sd.kind = d->local_sgd ? DSGD_STRATEGY_LOCAL : DSGD_STRATEGY_MIRRORED;
    sd.local = d->local;
    sd.comm_hook = d->comm_hook;
    sd.num_replicas = d->workers;
    sd.model = md;
    sd.model.max_batch = d->batch;
    sd.optimizer = d->optimizer;
    sd.algorithm = DSGD_ALLREDUCE_RING;
    sd.gradient_path = DSGD_GRADIENTS_HOST;
    sd.cpu_threads = 1;
    sd.timeout_s = 1e6;
    sd.endpoints = ep;
    if (!ep || !m.x || !m.y) goto done;
    for (i = 0; i < d->workers; ++i)
        if (dsgd_simnet_endpoint(hub, i, &ep[i]) != DSGD_OK) goto done;
    if (dsgd_strategy_create(ctx, &sd, &st) != DSGD_OK || dsgd_model_create(ctx, &md, &eval) != DSGD_OK) goto done;
    params = (float *)malloc(sizeof(float) * dsgd_model_num_params(eval));
    if (!params) goto done;
    for (m.step = 0; m.step < d->steps && !rows->stop; ++m.step) {
        if (dsgd_strategy_train_step_fn(st, sim_mirror_batch, &m, NULL) != DSGD_OK) goto done;
        if (!rows->done && ((m.step + 1) % d->eval_every == 0 || m.step + 1 == d->steps)) {
            double loss, acc;
            size_t np = dsgd_model_num_params(eval);
            if (dsgd_model_get_params(dsgd_strategy_model(st, 0), params, np) != DSGD_OK ||
                dsgd_model_set_params(eval, params, np) != DSGD_OK)
                goto done;
            sim_evaluate(eval, &data->test, &loss, &acc);
            sim_row(rows, m.step + 1, dsgd_simnet_time(hub, 0), loss, acc, sim_bytes_per_rank(hub, 0, d->workers));
        }
    }
    rc = 0;
done:
    if (rc != 0) fprintf(stderr, "%s: %s\n", d->name, dsgd_ctx_last_error(ctx));
    dsgd_strategy_destroy(st);
    dsgd_model_destroy(eval);
    free(params);
    free(m.x);
    free(m.y);
    free(ep);
    return rc;
}

/* ---------------------------------------------------------------- parameter servers */

typedef struct sim_ps {
    const sim_run_desc *d;
    const sim_data *data;
    dsgd_simnet *hub;
    dsgd_ctx **ctx;
    dsgd_shard_map *map;
    dsgd_ps_desc pd;
    const float *init;
    dsgd_model *model; /* the workers' model, shared (see sim_ps_rank) */
    sim_rows *rows;
    int stop_version; /* a worker saw the target: everyone stops at this version (0: none) */
    int64_t most_pushes; /* the most pushes a worker had made at a pull */
    int64_t stop_pushes; /* target_only, done, no stop_at_target: every worker stops after this many (0: none) */
    dsgd_result *res;
    char (*msg)[256];
    dsgd_ps_server_stats st;
} sim_ps;

/* A worker of the run: what its loop's callbacks (dsgd_ps_worker_run) use. */
typedef struct sim_ps_worker {
    sim_ps *ps;
    int rank;
    dsgd_ps_worker *w;
    dsgd_model *m; /* the run's shared model (sim_ps.model) */
    size_t np;
    float *x, *y;
    int64_t prev_v; /* the version read at the previous pull */
    long attempts;  /* backup_cancel: computes begun (each draws its time) */
} sim_ps_worker;

/* A model error on the run's ctx, also recorded on the worker's (whose
   message the run reports). */
static dsgd_result sim_ps_model_error(sim_ps_worker *sw, dsgd_result res) {
    dsgd_ctx_set_error(sw->ps->ctx[sw->rank], res, "%s", dsgd_ctx_last_error(dsgd_model_ctx(sw->m)));
    return res;
}

/* After each pull: the staleness counters, rank 1's rows (the pulled
   weights into the model first), and when to stop early (see
   sim_run_desc.steps; the rule of dsgd_ps_worker_run stops at `steps`
   pushes, or under BACKUP at version `steps`). With one server the
   version is the global step. */
static dsgd_result sim_ps_pulled(void *user, int64_t k, int64_t v, const float *params, int *stop) {
    sim_ps_worker *sw = (sim_ps_worker *)user;
    sim_ps *ps = sw->ps;
    const sim_run_desc *d = ps->d;
    dsgd_result res;
    if (k > 0) {
        ps->rows->pulls++;
        ps->rows->stale_sum += (double)(v - sw->prev_v - 1 > 0 ? v - sw->prev_v - 1 : 0);
    }
    sw->prev_v = v;
    if (k > ps->most_pushes) ps->most_pushes = k;
    if (sw->rank == 1 && !ps->rows->done && (v >= ps->rows->next_eval || (d->steps > 0 && v >= d->steps))) {
        double loss, acc;
        if ((res = dsgd_model_set_params(sw->m, params, sw->np)) != DSGD_OK) return sim_ps_model_error(sw, res);
        sim_evaluate(sw->m, &ps->data->test, &loss, &acc);
        sim_row(ps->rows, (long)v, dsgd_simnet_time(ps->hub, sw->rank), loss, acc,
                sim_bytes_per_rank(ps->hub, 1, d->workers));
        while (ps->rows->next_eval <= v) ps->rows->next_eval += d->eval_every;
        if (ps->rows->stop && !ps->stop_version) ps->stop_version = (int)v + 1;
        /* target_only and done, in a run that cannot stop at the target
           (SSP, SYNC): nothing more is wanted, so every worker stops at
           one push count, one past the most any has made, as a run with
           that many steps would */
        if (ps->rows->done && !d->stop_at_target && !dsgd_ps_policy_stops_on_global(d->policy) && !ps->stop_pushes)
            ps->stop_pushes = ps->most_pushes + 1;
    }
    /* the time limit; the updates; once a worker saw the target, at once,
       or, where the workers stop on the global step, at the next one */
    *stop = (d->max_time_s > 0 && dsgd_simnet_time(ps->hub, sw->rank) >= d->max_time_s) ||
            (d->steps > 0 && v >= d->steps) ||
            (ps->stop_version && (!dsgd_ps_policy_stops_on_global(d->policy) || v >= ps->stop_version)) ||
            (ps->stop_pushes && k >= ps->stop_pushes);
    return DSGD_OK;
}

/* The gradient of batch k at the pulled weights (params, into the shared
   model first), then the step's compute time on the virtual clock. */
static dsgd_result sim_ps_grad(void *user, int64_t k, const float *params, float *grads) {
    sim_ps_worker *sw = (sim_ps_worker *)user;
    const sim_run_desc *d = sw->ps->d;
    dsgd_result res = DSGD_OK;
    if (sw->ps->rows->done) { /* target_only: nothing more is wanted of the values */
        memset(grads, 0, sizeof(float) * sw->np);
    } else {
        sim_draw(&sw->ps->data->train, d->seed, d->ps_draw_as_replica ? sw->rank - 1 : sw->rank, (long)k, d->batch,
                 sw->x, sw->y);
        res = dsgd_model_set_params(sw->m, params, sw->np);
        if (res == DSGD_OK) res = dsgd_model_compute_gradients(sw->m, sw->x, sw->y, d->batch, 1.0f / (float)d->batch);
        if (res == DSGD_OK) res = dsgd_model_get_grads(sw->m, grads, sw->np);
        if (res != DSGD_OK) return sim_ps_model_error(sw, res);
    }
    if (d->backup_cancel) /* a CANCEL may cut it short: the loop then pulls again */
        return dsgd_ps_worker_compute_for(sw->w, dsgd_simnet_compute_time(sw->ps->hub, sw->rank, sw->attempts++), NULL);
    return dsgd_simnet_compute(sw->ps->hub, sw->rank, (long)k);
}

/* After each push: BACKUP's dropped gradients. */
static dsgd_result sim_ps_pushed(void *user, int64_t k) {
    sim_ps_worker *sw = (sim_ps_worker *)user;
    (void)k;
    if (dsgd_ps_worker_last_push_dropped(sw->w, 0)) {
        sw->ps->rows->dropped++;
        sw->ps->rows->dropped_total++;
    }
    return DSGD_OK;
}

/* One rank's program, run by the hub (dsgd_simnet_run: fibers on one
   thread where the build has them, else a thread per rank). Exactly one
   rank runs at a time (the hub's turn; no parking here), so the shared
   counters in rows need no lock and their order is the simulation's. A
   worker runs the engine's loop (dsgd_ps_worker_run: pull, stop rule,
   compute, push) with the callbacks above. The workers share one model
   (the run's, sim_ps.model): a worker sets the pulled weights, computes and
   reads its gradient within one turn, before its compute charge hands the
   turn on, and the model keeps nothing else between steps (the servers
   hold the optimizer), so its results are those of a model per worker,
   without P models' memory and initialisation. */
static void sim_ps_rank(dsgd_simnet *hub, int rank, const dsgd_transport_i *t, void *user) {
    sim_ps *ps = (sim_ps *)user;
    const sim_run_desc *d = ps->d;
    dsgd_ctx *ctx = ps->ctx[rank];
    dsgd_result res;
    (void)hub;
    if (rank == 0) {
        dsgd_ps_server *s = NULL;
        res = dsgd_ps_server_create(ctx, t, &ps->pd, ps->map, ps->init, &s);
        if (res == DSGD_OK) res = dsgd_ps_server_serve(s);
        if (res == DSGD_OK) {
            dsgd_ps_server_get_stats(s, &ps->st);
            ps->st.staleness_hist = NULL;
        }
        dsgd_ps_server_destroy(s);
    } else {
        sim_ps_worker sw;
        dsgd_ps_run_desc run;
        const dsgd_dataset *tr = &ps->data->train;
        memset(&sw, 0, sizeof(sw));
        sw.ps = ps;
        sw.rank = rank;
        sw.m = ps->model;
        res = dsgd_ps_worker_create(ctx, t, &ps->pd, ps->map, &sw.w);
        if (res == DSGD_OK) {
            sw.np = dsgd_model_num_params(sw.m);
            sw.x = (float *)malloc(sizeof(float) * (size_t)d->batch * (size_t)tr->dim);
            sw.y = (float *)malloc(sizeof(float) * (size_t)d->batch);
            if (!sw.x || !sw.y) res = DSGD_ERR_OUT_OF_MEMORY;
        }
        memset(&run, 0, sizeof(run));
        run.steps = d->steps > 0 ? d->steps : INT64_MAX; /* ASYNC's steps 0: no limit */
        run.grad = sim_ps_grad;
        run.user = &sw;
        run.num_floats = sw.np;
        run.after_pull = sim_ps_pulled;
        run.after_push = sim_ps_pushed;
        if (res == DSGD_OK) res = dsgd_ps_worker_run(sw.w, &run);
        dsgd_ps_worker_destroy(sw.w);
        free(sw.x);
        free(sw.y);
    }
    ps->res[rank] = res;
    if (res != DSGD_OK) {
        snprintf(ps->msg[rank], sizeof(ps->msg[rank]), "%.250s", dsgd_ctx_last_error(ctx));
        dsgd_simnet_abort(ps->hub);
    }
}

static int sim_run_ps(dsgd_ctx *ctx, const sim_run_desc *d, const sim_data *data, dsgd_simnet *hub, sim_rows *rows,
                      sim_result *out) {
    int n = d->workers + 1, i, rc = -1;
    sim_ps ps;
    dsgd_model_desc md;
    dsgd_model *m0 = NULL;
    float *init = NULL;
    memset(&ps, 0, sizeof(ps));
    if (d->steps <= 0 && d->max_time_s <= 0) {
        fprintf(stderr, "%s: a parameter-server run needs steps > 0 or max_time_s > 0\n", d->name);
        return -1;
    }
    ps.d = d;
    ps.data = data;
    ps.hub = hub;
    ps.rows = rows;
    ps.ctx = (dsgd_ctx **)calloc((size_t)n, sizeof(*ps.ctx));
    ps.res = (dsgd_result *)calloc((size_t)n, sizeof(*ps.res));
    ps.msg = (char(*)[256])calloc((size_t)n, 256);
    if (!ps.ctx || !ps.res || !ps.msg) goto done;
    /* the workers' model; its weights (by seed) are the initial ones */
    memset(&md, 0, sizeof(md));
    md.input_dim = data->train.dim;
    md.layers = d->layers;
    md.num_layers = d->num_layers;
    md.max_batch = d->batch < 256 ? 256 : d->batch;
    md.seed = d->seed;
    if (dsgd_model_create(ctx, &md, &m0) != DSGD_OK) goto done;
    init = (float *)malloc(sizeof(float) * dsgd_model_num_params(m0));
    if (!init || dsgd_model_get_params(m0, init, dsgd_model_num_params(m0)) != DSGD_OK) goto done;
    ps.init = init;
    ps.model = m0;
    if (dsgd_shard_map_create(ctx, dsgd_model_variable(m0, 0), dsgd_model_num_variables(m0), 1, NULL, &ps.map) !=
        DSGD_OK)
        goto done;
    ps.pd.num_servers = 1;
    ps.pd.num_workers = d->workers;
    ps.pd.policy = d->policy;
    ps.pd.staleness = d->staleness;
    ps.pd.backup_workers = d->backups;
    ps.pd.backup_cancel = d->backup_cancel;
    ps.pd.optimizer = d->optimizer;
    ps.pd.timeout_s = 1e6; /* virtual: nothing times out */
    ps.pd.retry_s = 1e5;   /* no resends: the virtual network loses nothing */
    ps.pd.staleness_bins = 64;
    for (i = 0; i < n; ++i)
        if (dsgd_ctx_create(NULL, &ps.ctx[i]) != DSGD_OK) goto done;
    if (dsgd_simnet_run(hub, sim_ps_rank, &ps) != DSGD_OK) {
        fprintf(stderr, "%s: %s\n", d->name, dsgd_ctx_last_error(ctx));
        goto done;
    }
    rc = 0;
    for (i = 0; i < n; ++i)
        if (ps.res[i] != DSGD_OK && rc == 0) {
            fprintf(stderr, "%s: rank %d: %s\n", d->name, i, ps.msg[i]);
            rc = -1;
        }
    out->staleness_mean = ps.st.staleness_mean;
done:
    if (ps.ctx)
        for (i = 0; i < n; ++i) dsgd_ctx_destroy(ps.ctx[i]);
    dsgd_shard_map_destroy(ps.map);
    dsgd_model_destroy(m0);
    free(init);
    free(ps.ctx);
    free(ps.res);
    free(ps.msg);
    return rc;
}

/* ---------------------------------------------------------------- one run */

/* Runs d on its own hub; fills *out. Returns 0, or -1 after printing why. */
static int sim_run(const sim_run_desc *d, const sim_data *data, sim_result *out) {
    dsgd_ctx *ctx = NULL;
    dsgd_simnet *hub = NULL;
    dsgd_simnet_desc nd = d->net;
    dsgd_simnet_stats stats;
    sim_rows rows;
    int rc = -1;
    double t0 = dsgd_now();
    memset(out, 0, sizeof(*out));
    out->time_to_target = -1;
    out->steps_to_target = -1;
    if (d->target_only && d->csv) {
        fprintf(stderr, "%s: target_only writes no rows (csv must be NULL)\n", d->name);
        return -1;
    }
    memset(&rows, 0, sizeof(rows));
    rows.d = d;
    rows.res = out;
    rows.next_eval = d->eval_every;
    nd.ranks = d->kind == SIM_MIRRORED ? d->workers : d->workers + 1;
    nd.park_between_calls = d->kind == SIM_MIRRORED;
    nd.trace = d->trace_path != NULL;
    nd.trace_until_s = d->trace_until_s;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return -1;
    if (dsgd_simnet_create(ctx, &nd, &hub) != DSGD_OK) {
        fprintf(stderr, "%s: %s\n", d->name, dsgd_ctx_last_error(ctx));
        dsgd_ctx_destroy(ctx);
        return -1;
    }
    rc = d->kind == SIM_MIRRORED ? sim_run_mirrored(ctx, d, data, hub, &rows)
                                 : sim_run_ps(ctx, d, data, hub, &rows, out);
    if (rc == 0 && d->trace_path) {
        FILE *f = fopen(d->trace_path, "w");
        if (!f || dsgd_simnet_write_trace(hub, f) != DSGD_OK) {
            fprintf(stderr, "%s: cannot write the trace %s: %s\n", d->name, d->trace_path, dsgd_ctx_last_error(ctx));
            rc = -1;
        }
        if (f) fclose(f);
    }
    dsgd_simnet_get_stats(hub, &stats);
    out->dropped = rows.dropped_total;
    out->events = stats.messages + stats.computes;
    dsgd_simnet_destroy(hub);
    dsgd_ctx_destroy(ctx);
    out->wall_s = dsgd_now() - t0;
    return rc;
}

/* ---------------------------------------------------------------- gnuplot */

/* Creates directory `dir` (one level) unless it exists; 0 on success. */
SIM_MAYBE_UNUSED static int sim_mkdir(const char *dir) {
    if (mkdir(dir, 0777) == 0 || errno == EEXIST) return 0;
    fprintf(stderr, "error: cannot create %s\n", dir);
    return -1;
}

/* Non-zero when gnuplot is on the PATH. */
SIM_MAYBE_UNUSED static int sim_have_gnuplot(void) { return system("command -v gnuplot >/dev/null 2>&1") == 0; }

/* Runs gnuplot on script (text); returns 0 when it succeeded. */
SIM_MAYBE_UNUSED static int sim_gnuplot(const char *script) {
    FILE *p = popen("gnuplot", "w");
    if (!p) return -1;
    fputs(script, p);
    return pclose(p) == 0 ? 0 : -1;
}

#endif /* SIM_COMMON_H */
